package fencelock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// findings runs Check on a Locker over client and returns its findings by
// check name.
func findings(t *testing.T, l *Locker) map[string][]Finding {
	t.Helper()
	fs, err := l.Check(ctx)
	require.NoError(t, err)
	by := map[string][]Finding{}
	for i, f := range fs {
		t.Log(f)
		if i > 0 {
			assert.LessOrEqual(t, f.Severity, fs[i-1].Severity, "most severe first")
		}
		by[f.Check] = append(by[f.Check], f)
	}
	return by
}

func checkLocker(t *testing.T, client redis.UniversalClient, opts *Options) *Locker {
	t.Helper()
	l, err := New(client, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestCheckMaxmemoryPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy string
		want   Severity
		found  bool
	}{
		{"volatile-lru", SeverityCritical, true},
		{"volatile-ttl", SeverityCritical, true},
		{"allkeys-lru", SeverityWarning, true},
		{"noeviction", 0, false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, "--maxmemory", "100mb", "--maxmemory-policy", tc.policy)
			by := findings(t, checkLocker(t, srv.Client(nil), nil))
			if !tc.found {
				assert.Empty(t, by["maxmemory-policy"])
				return
			}
			require.Len(t, by["maxmemory-policy"], 1)
			f := by["maxmemory-policy"][0]
			assert.Equal(t, tc.want, f.Severity)
			assert.Contains(t, f.Seen, tc.policy)
			assert.Contains(t, f.Fix, "noeviction")
			assert.Equal(t, srv.Addr, f.Node)
		})
	}
}

func TestCheckPersistence(t *testing.T) {
	t.Parallel()
	off := redistest.Start(t) // --appendonly no, --save ""
	by := findings(t, checkLocker(t, off.Client(nil), nil))
	require.Len(t, by["persistence"], 1)
	assert.Equal(t, SeverityWarning, by["persistence"][0].Severity)
	assert.Contains(t, by["persistence"][0].Means, "grants them again")

	always := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	by = findings(t, checkLocker(t, always.Client(nil), nil))
	assert.Empty(t, by["persistence"])

	everysec := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	by = findings(t, checkLocker(t, everysec.Client(nil), nil))
	require.Len(t, by["persistence"], 1)
	assert.Equal(t, SeverityInfo, by["persistence"][0].Severity)
}

func TestCheckReplicas(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	redistest.StartReplica(t, master)
	by := findings(t, checkLocker(t, master.Client(nil), &Options{Replicas: 2}))
	require.Len(t, by["replicas"], 1)
	assert.Equal(t, SeverityCritical, by["replicas"][0].Severity)
	assert.Contains(t, by["replicas"][0].Seen, "1 replicas online, Options.Replicas is 2")

	by = findings(t, checkLocker(t, master.Client(nil), &Options{Replicas: 1}))
	assert.Empty(t, by["replicas"])
	assert.Empty(t, by["permissions"], "the test lock was acknowledged")
}

func TestCheckPermissions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	_, err := srv.Do("ACL", "SETUSER", "nochannels", "on", ">pw", "~lock:*", "+@all")
	require.NoError(t, err)
	_, err = srv.Do("ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
	require.NoError(t, err)
	_, err = srv.Do("ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config", "-info")
	require.NoError(t, err)

	by := findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "nochannels", Password: "pw"}), nil))
	require.Len(t, by["permissions"], 2, "publish and subscribe")
	for _, f := range by["permissions"] {
		assert.Equal(t, SeverityWarning, f.Severity)
		assert.Contains(t, f.Means, "poll")
	}

	by = findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "noscripts", Password: "pw"}), nil))
	require.NotEmpty(t, by["permissions"])
	assert.Equal(t, SeverityCritical, by["permissions"][0].Severity)
	assert.Contains(t, by["permissions"][0].Seen, "NOPERM")

	// A managed service's user without CONFIG or INFO: findings, no error.
	by = findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "noconfig", Password: "pw"}), nil))
	require.NotEmpty(t, by["config"])
	for _, f := range by["config"] {
		assert.Equal(t, SeverityInfo, f.Severity)
		assert.Contains(t, f.Seen, "not answered")
	}
}

// TestCheckLeavesNothing: Check's test lock leaves no key behind, its fence
// counter and token marker included (issue 28: `fencelock doctor` left
// lock:{fencelock-check:…}:fence for FenceRetention).
func TestCheckLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, prefix := range []string{"lock:", "svc:"} {
		l := checkLocker(t, srv.Client(nil), &Options{KeyPrefix: prefix})
		findings(t, l)
		keys, err := srv.Do("KEYS", "*")
		require.NoError(t, err)
		assert.Empty(t, keys, "keys left by Check with KeyPrefix %q", prefix)
	}
}

func TestCheckRoundTrip(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, client.Ping(ctx).Err())

	// Within the allowance: Info. At TTL 10 minutes the allowance is 6s,
	// which no loopback round trip reaches, on a busy machine either (at
	// TTL 1s, 12ms, it measured 138ms once).
	by := findings(t, checkLocker(t, client, &Options{TTL: 10 * time.Minute}))
	require.Len(t, by["round-trip"], 1)
	assert.Equal(t, SeverityInfo, by["round-trip"][0].Severity)

	// Beyond it: a warning. A busy machine only lengthens the round trip.
	proxy.SetLatency(10 * time.Millisecond) // a 20ms round trip, against 12ms at TTL 1s
	by = findings(t, checkLocker(t, client, &Options{TTL: time.Second}))
	require.Len(t, by["round-trip"], 1)
	assert.Equal(t, SeverityWarning, by["round-trip"][0].Severity)
	assert.Contains(t, by["round-trip"][0].Fix, "longer TTL")
}

func TestCheckReplicaInsteadOfMaster(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	by := findings(t, checkLocker(t, replica.Client(nil), nil))
	require.Len(t, by["role"], 1)
	assert.Equal(t, SeverityCritical, by["role"][0].Severity)
}

func TestCheckUnreachable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(&redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	srv.Kill()
	fs, err := checkLocker(t, client, nil).Check(ctx)
	require.NoError(t, err, "an outage is a finding")
	require.NotEmpty(t, fs)
	assert.Equal(t, SeverityCritical, fs[0].Severity)
	assert.Equal(t, "reachable", fs[0].Check)
}

func TestCheckRedlockIndependence(t *testing.T) {
	t.Parallel()
	a := redistest.Start(t)
	b := redistest.StartReplica(t, a) // not independent of a
	c := redistest.Start(t)
	l, err := NewRedlock([]redis.UniversalClient{a.Client(nil), b.Client(nil), c.Client(nil)}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	by := findings(t, l)
	require.Len(t, by["independence"], 1)
	f := by["independence"][0]
	assert.Equal(t, SeverityCritical, f.Severity)
	assert.Contains(t, f.Node, "node 0")
	assert.Contains(t, f.Node, "node 1")
	assert.Contains(t, f.Seen, "a master and its replica")

	// The same server twice, through two clients.
	l2, err := NewRedlock([]redis.UniversalClient{a.Client(nil), a.Client(nil), c.Client(nil)}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l2.Close() })
	by = findings(t, l2)
	require.Len(t, by["independence"], 1)
	assert.Contains(t, by["independence"][0].Seen, "the same server")
}

func TestCheckCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 3, 0)
	by := findings(t, checkLocker(t, c.Client(nil), nil))
	require.Len(t, by["persistence"], 3, "one finding per master")
	nodes := map[string]bool{}
	for _, f := range by["persistence"] {
		nodes[f.Node] = true
	}
	assert.Len(t, nodes, 3)
	assert.Empty(t, by["permissions"])
	assert.True(t, strings.HasPrefix(by["round-trip"][0].Seen, "round trip"))
}

// TestCheckReturnsByItsDeadline: with the deployment's servers paused
// (SIGSTOP), Check returns within deadlineSlack of its caller's deadline
// (500ms; 1s on a Redlock, whose first two nodes answer)
// whatever the go-redis client's options, on a standalone server, a
// Cluster, a Ring and a Redlock (issue 34: 10s on go-redis's defaults,
// 5.5s with ContextTimeoutEnabled, for a 500ms deadline). Its error matches
// the deadline's; it reports what it found before (a Redlock's nodes that
// answered) and nothing about a server whose PING the deadline cut short:
// not that it answered, not that it is unreachable. Nothing is left
// behind once the servers answer again and the Locker is closed.
func TestCheckReturnsByItsDeadline(t *testing.T) {
	t.Parallel()
	for _, opts := range []struct {
		name    string
		timeout bool // ContextTimeoutEnabled
	}{{"go-redis defaults", false}, {"ContextTimeoutEnabled", true}} {
		t.Run(opts.name, func(t *testing.T) {
			t.Parallel()
			for _, kind := range []string{"standalone", "cluster", "ring", "redlock"} {
				t.Run(kind, func(t *testing.T) {
					t.Parallel()
					checkPaused(t, kind, opts.timeout)
				})
			}
		})
	}
}

// checkPaused runs Check with a deadline on a deployment of kind whose
// servers are paused: all of them, or a Redlock's last node only.
func checkPaused(t *testing.T, kind string, ctxTimeout bool) {
	t.Helper()
	var (
		client  redis.UniversalClient
		all     []*redistest.Server // every server, to look for keys left
		stopped []*redistest.Server // the servers paused
		l       *Locker
	)
	switch kind {
	case "standalone":
		srv := redistest.Start(t)
		client, all = srv.Client(&redis.Options{ContextTimeoutEnabled: ctxTimeout}), []*redistest.Server{srv}
	case "cluster":
		c := redistest.StartClusterN(t, 3, 0)
		client, all = c.Client(&redis.ClusterOptions{ContextTimeoutEnabled: ctxTimeout}), c.Masters
	case "ring":
		a, b := redistest.Start(t), redistest.Start(t)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr},
			ContextTimeoutEnabled: ctxTimeout})
		t.Cleanup(func() { _ = ring.Close() })
		client, all = ring, []*redistest.Server{a, b}
	case "redlock":
		var clients []redis.UniversalClient
		for range 3 {
			srv := redistest.Start(t)
			all = append(all, srv)
			clients = append(clients, srv.Client(&redis.Options{ContextTimeoutEnabled: ctxTimeout}))
		}
		var err error
		l, err = NewRedlock(clients, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		stopped = all[2:]
	}
	if l == nil {
		l = checkLocker(t, client, nil)
		require.NoError(t, client.Ping(ctx).Err(), "connected before the pause")
		stopped = all
	}
	for _, srv := range stopped {
		pause(t, srv)
	}

	d := 500 * time.Millisecond
	if kind == "redlock" {
		d = time.Second // time to check the nodes that answer, on a loaded machine
	}
	c := withTimeout(t, d)
	var fs []Finding
	err := returnsBy(t, d, fmt.Sprintf("Check(ctx %v)", d), func() error {
		var err error
		fs, err = l.Check(c)
		return err
	})
	requireNoVerdict(t, err, context.DeadlineExceeded, "Check")
	for _, f := range fs {
		t.Log(f)
		assert.NotEqual(t, "reachable", f.Check, "the deadline cut the PING short: no verdict on whether the server answers")
		if kind != "redlock" {
			assert.NotContains(t, []string{"round-trip", "permissions"}, f.Check, "a paused server was not reached")
			continue
		}
		node, _, _ := strings.Cut(f.Node, " (") // "node 0 (127.0.0.1:6379)"
		assert.Contains(t, []string{"node 0", "node 1"}, node, "a finding about the paused node or the whole quorum")
	}
	if kind == "redlock" {
		var found []string
		for _, f := range fs {
			node, _, _ := strings.Cut(f.Node, " (")
			found = append(found, node+" "+f.Check)
		}
		assert.Contains(t, found, "node 0 round-trip", "the findings of the nodes that answered are returned")
		assert.Contains(t, found, "node 1 round-trip", "the findings of the nodes that answered are returned")
	}

	// Once the servers answer again, Close waits for what Check left in
	// flight, and no test lock is left anywhere.
	for _, srv := range stopped {
		srv.Resume()
	}
	require.NoError(t, l.Close())
	for _, srv := range all {
		keys, err := srv.Do("KEYS", "*")
		require.NoError(t, err)
		assert.Empty(t, keys, "keys left on %s", srv.Addr)
	}
}

// TestCheckCleanUpGoesOnInTheBackground: the server stops answering
// (SIGSTOP) as Check takes its test lock. Check returns by its deadline,
// where it waited for its clean-up's ReleaseTimeout (5s); the clean-up, a
// DEL of the test lock's keys, goes on in the background, and Close waits
// for it.
func TestCheckCleanUpGoesOnInTheBackground(t *testing.T) {
	t.Parallel()
	for _, tc := range clientOptionCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			l := e.locker(t, nil)
			t.Cleanup(e.srv.Resume) // before Close waits
			var (
				paused sync.Once
				dels   atomic.Int32
			)
			e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
				switch {
				case scriptName(cmd) == "acquire":
					paused.Do(func() { _ = syscall.Kill(e.srv.Pid(), syscall.SIGSTOP) })
				case cmd.Name() == "del" && strings.Contains(fmt.Sprint(cmd.Args()), "fencelock-check:"):
					dels.Add(1)
				}
				return nil
			}, nil)

			d := 500 * time.Millisecond
			err := returnsBy(t, d, "Check(ctx 500ms)", func() error {
				_, err := l.Check(withTimeout(t, d))
				return err
			})
			requireNoVerdict(t, err, context.DeadlineExceeded, "Check")

			closed := make(chan struct{})
			go func() {
				defer close(closed)
				_ = l.Close()
			}()
			select {
			case <-closed:
				t.Fatal("Close returned while Check's clean-up was in flight on a paused Redis")
			case <-time.After(300 * time.Millisecond):
			}
			e.srv.Resume()
			select {
			case <-closed:
			case <-time.After(10 * time.Second): // far above the wait for a Redis that answers
				t.Fatal("Close did not return after Redis answered again")
			}
			assert.Positive(t, dels.Load(), "the clean-up deleted the test lock's keys")
		})
	}
}

// TestCheckLeavesNoSubscription: Check's subscription test closes the
// connection it subscribed on, also where it falls back to SUBSCRIBE
// (SSUBSCRIBE unknown, as before Redis 7): once the Locker is closed, the
// server has no pub/sub client left.
func TestCheckLeavesNoSubscription(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"--rename-command", "ssubscribe", ""}} {
		srv := redistest.Start(t, args...)
		l := checkLocker(t, srv.Client(nil), nil)
		findings(t, l)
		require.NoError(t, l.Close())
		var clients any
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if clients, _ = srv.Do("CLIENT", "LIST", "TYPE", "pubsub"); clients == "" {
				break
			}
		}
		assert.Equal(t, "", clients, "server args %q: pub/sub clients left", args)
	}
}
