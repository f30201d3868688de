package fencelock

import (
	"strings"
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
