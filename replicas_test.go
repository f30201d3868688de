package fencelock

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// replicated is a master with replicas, and a Locker on the master.
func replicated(t *testing.T, replicas int, opts *Options) (*redistest.Server, []*redistest.Server, *Locker, *redis.Client) {
	t.Helper()
	master := redistest.Start(t)
	var rs []*redistest.Server
	for range replicas {
		rs = append(rs, redistest.StartReplica(t, master))
	}
	client := master.Client(nil)
	l, err := New(client, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return master, rs, l, master.Client(nil)
}

func TestReplicasAcknowledgeTheLock(t *testing.T) {
	t.Parallel()
	_, rs, l, _ := replicated(t, 2, &Options{Replicas: 2})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err, "two replicas acknowledge")
	for i, r := range rs {
		v, err := r.Do("GET", lease.Key())
		require.NoError(t, err)
		assert.Equal(t, lease.Token()+" ", v.(string)[:len(lease.Token())+1], "replica %d has the lock when Acquire returns", i)
	}
	require.NoError(t, lease.Extend(ctx, time.Minute))
	require.NoError(t, lease.Release(ctx))
}

func TestReplicasShortOfAcknowledgements(t *testing.T) {
	t.Parallel()
	master, rs, _, admin := replicated(t, 2, nil)
	rs[1].Pause() // only one replica can acknowledge
	t.Cleanup(rs[1].Resume)

	one, err := New(master.Client(nil), &Options{Replicas: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close() })
	lease, err := one.Acquire(ctx, uniqueName(t)+"-one")
	require.NoError(t, err, "one replica acknowledges: enough for Replicas 1")
	require.NoError(t, lease.Release(ctx))

	// 250ms: the replica that runs acknowledges within it even on a loaded
	// machine (50ms measured "0 of 2" once in a full -race run).
	two, err := New(master.Client(nil), &Options{Replicas: 2, ReplicaTimeout: 250 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = two.Close() })
	name := uniqueName(t) + "-two"
	start := time.Now()
	_, err = two.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Contains(t, err.Error(), "1 of 2 replicas acknowledged")
	assert.Less(t, time.Since(start), time.Second, "bounded by ReplicaTimeout")
	key, _ := two.keys(name)
	require.Eventually(t, func() bool { return admin.Exists(ctx, key).Val() == 0 }, 5*time.Second, time.Millisecond,
		"the lock that too few replicas acknowledged is released")

	// An extension short of replicas does not move Deadline, and is a
	// failed renewal for the watchdog.
	rs[1].Resume()
	lease, err = two.Acquire(ctx, name, WithWait(5*time.Second))
	require.NoError(t, err)
	rs[1].Pause()
	before := lease.Deadline()
	err = lease.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "1 of 2 replicas acknowledged")
	assert.False(t, lease.Deadline().After(before), "Deadline not moved")
	rs[1].Resume()
	require.NoError(t, lease.Release(ctx))
}

func TestReplicasWaitOnTheScriptsOwnConnection(t *testing.T) {
	// WAIT counts the writes of its own connection. With the only replica
	// paused, the library's WAIT (pipelined after the script) sees the lock
	// unacknowledged; a WAIT on another connection returns at once with the
	// replica counted, and would have let the lock through.
	t.Parallel()
	master, rs, _, admin := replicated(t, 1, nil)
	rs[0].Pause()
	t.Cleanup(rs[0].Resume)
	l, err := New(master.Client(nil), &Options{Replicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })

	_, err = l.Acquire(ctx, uniqueName(t))
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged")

	// The same write, then WAIT on a connection that wrote nothing (raw,
	// as a WAIT sent separately through a pool could land on): it counts
	// the paused replica, which never received the write.
	require.NoError(t, admin.Set(ctx, uniqueName(t)+"-plain", "x", 0).Err())
	conn, err := net.Dial("tcp", master.Addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("WAIT 1 50\r\n"))
	require.NoError(t, err)
	reply, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, ":1\r\n", reply, "a WAIT on another connection counts the paused replica")
}

func TestReplicasInvalidOptions(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name string
		opts Options
		msg  string
	}{
		{"negative", Options{Replicas: -1}, "Replicas"},
		{"negative timeout", Options{Replicas: 1, ReplicaTimeout: -1}, "ReplicaTimeout"},
		{"tiny timeout", Options{Replicas: 1, ReplicaTimeout: time.Microsecond}, "less than 1ms"},
		{"timeout against TTL", Options{Replicas: 1, TTL: 300 * time.Millisecond, ReplicaTimeout: 100 * time.Millisecond}, "a third"},
		{"fsync alone", Options{ReplicaFsync: true}, "ReplicaFsync"},
	} {
		_, err := New(e.client, &tc.opts)
		require.ErrorIs(t, err, ErrInvalid, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	l := e.locker(t, &Options{Replicas: 1})
	_, err := l.Acquire(ctx, "x", WithTTL(200*time.Millisecond))
	require.ErrorIs(t, err, ErrInvalid, "the default 100ms against WithTTL 200ms")
	assert.Zero(t, e.hook.calls.Load(), "no Redis call")
}

func TestReplicaFsyncNeedsWaitAOF(t *testing.T) {
	t.Parallel()
	master, _, _, _ := replicated(t, 1, nil)
	version := master.Info("server")["redis_version"]
	l, err := New(master.Client(nil), &Options{Replicas: 1, ReplicaFsync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	_, err = l.Acquire(ctx, uniqueName(t))
	if version < "7.2" {
		require.ErrorIs(t, err, ErrMisconfigured, "WAITAOF is unknown before Redis 7.2 (%s)", version)
		assert.Contains(t, strings.ToLower(err.Error()), "unknown command")
		// Issue 28: the advice names what WAITAOF needs, not the
		// Redis 6.2 that the rest of fencelock needs.
		assert.Contains(t, err.Error(), "WAITAOF needs Redis 7.2 or later")
		assert.Contains(t, err.Error(), "appendonly yes")
		assert.NotContains(t, err.Error(), "6.2")
		return
	}
	// Redis 7.2 and later: the master and the replica need appendonly.
	t.Skipf("WAITAOF with appendonly is not tested on Redis %s here", version)
}

func TestReplicasWithSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	redistest.StartReplica(t, master)
	var sentinels []string
	for range 3 {
		sentinels = append(sentinels, redistest.StartSentinel(t, master, 2).Addr)
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "fl", SentinelAddrs: sentinels})
	t.Cleanup(func() { _ = client.Close() })
	l, err := New(client, &Options{Replicas: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	v, err := replica.Do("GET", lease.Key())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(v.(string), lease.Token()+" "), "on the replica when Acquire returns")
	require.NoError(t, lease.Release(ctx))

	replica.Pause()
	t.Cleanup(replica.Resume)
	_, err = l.Acquire(ctx, uniqueName(t)+"-short")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "1 of 2 replicas acknowledged")
}

func TestReplicasOnCluster(t *testing.T) {
	// WAIT goes to the master that serves the lock's slot, on the
	// connection that ran the script.
	t.Parallel()
	c := redistest.StartClusterN(t, 3, 1)
	l, err := New(c.Client(nil), &Options{Replicas: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	masters := map[*redistest.Server]string{}
	for i := 0; len(masters) < 3 && i < 100; i++ {
		name := uniqueName(t) + strings.Repeat("x", i)
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err, "the replica of the slot's master acknowledges")
		slot, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", lease.Key())
		require.NoError(t, err)
		masters[c.MasterOf(int(slot.(int64)))] = name
		require.NoError(t, lease.Release(ctx))
	}
	require.Len(t, masters, 3, "locks on every master")

	// Pause the replica of one master: locks served by that master fail,
	// the others do not.
	c.Replicas[0][0].Pause()
	t.Cleanup(c.Replicas[0][0].Resume)
	for m, name := range masters {
		lease, err := l.Acquire(ctx, name)
		if m == c.Masters[0] {
			require.ErrorIs(t, err, ErrUnavailable, "the paused replica's master")
			assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged")
			continue
		}
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
	}
}

// pausedReplica is a master with one replica, a Locker with Replicas 1 on
// it, and the replica paused (SIGSTOP) until the test ends: every WAIT comes
// back short.
func pausedReplica(t *testing.T, opts Options) (*Locker, *redis.Client, *redistest.Server) {
	t.Helper()
	l, admin, replica := oneReplica(t, opts)
	replica.Pause()
	return l, admin, replica
}

// oneReplica is a master with one replica, and a Locker with Replicas 1 on
// it (ReplicaTimeout 50ms unless opts says); the replica is resumed before
// the servers' own clean-up (last in, first out) if the test pauses it.
func oneReplica(t *testing.T, opts Options) (*Locker, *redis.Client, *redistest.Server) {
	t.Helper()
	master, rs, _, admin := replicated(t, 1, nil)
	t.Cleanup(rs[0].Resume)
	opts.Replicas = 1
	if opts.ReplicaTimeout == 0 {
		opts.ReplicaTimeout = 50 * time.Millisecond
	}
	l, err := New(master.Client(nil), &opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l, admin, rs[0]
}

func TestReplicasShortWaitKeepsBusy(t *testing.T) {
	// The script found the lock held and wrote nothing: its answer stands
	// although no replica acknowledged.
	t.Parallel()
	l, admin, _ := pausedReplica(t, Options{})
	name := uniqueName(t)
	key, _ := l.keys(name)
	require.NoError(t, admin.Set(ctx, key, "other-token 1 the-holder", time.Minute).Err())

	_, err := l.Acquire(ctx, name)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.Equal(t, "the-holder", busy.Owner)
	assert.Equal(t, "other-token 1 the-holder", admin.Get(ctx, key).Val(), "the holder's lock untouched")
}

func TestReplicasShortWaitFailOpenKeepsBusy(t *testing.T) {
	// FailOpen runs the work degraded only when Redis is unavailable, not
	// while another holds the lock.
	t.Parallel()
	l, admin, _ := pausedReplica(t, Options{FailOpen: true})
	name := uniqueName(t)
	key, _ := l.keys(name)
	require.NoError(t, admin.Set(ctx, key, "other-token 1 the-holder", time.Minute).Err())

	ran := false
	err := l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrNotObtained)
	assert.False(t, ran, "FailOpen does not run the work while another holds the lock")
	assert.Equal(t, "other-token 1 the-holder", admin.Get(ctx, key).Val(), "the holder's lock untouched")
}

func TestReplicasShortWaitKeepsNotHeld(t *testing.T) {
	// The script found the lock gone, or another's, and wrote nothing:
	// Extend says so.
	t.Parallel()
	l, admin, replica := oneReplica(t, Options{})

	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	require.NoError(t, admin.Del(ctx, lease.Key()).Err())
	replica.Pause()
	err = lease.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.NotErrorIs(t, err, ErrUnavailable)

	// Taken over while the replica cannot acknowledge: not held either.
	replica.Resume()
	lease, err = l.Acquire(ctx, uniqueName(t)+"-taken")
	require.NoError(t, err)
	require.NoError(t, admin.Set(ctx, lease.Key(), "other-token 1 x", time.Minute).Err())
	replica.Pause()
	err = lease.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.NotErrorIs(t, err, ErrUnavailable)
}

func TestReplicasShortWaitWatchdogLoses(t *testing.T) {
	// A 600ms lease renewed every 200ms, its lock deleted while the
	// replica cannot acknowledge, is lost at the next renewal, well before
	// its deadline.
	t.Parallel()
	l, admin, replica := oneReplica(t, Options{})
	ttl := 600 * time.Millisecond
	var cause error
	var lostAfter time.Duration
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		require.NoError(t, admin.Del(ctx, lease.Key()).Err())
		replica.Pause()
		start := time.Now()
		select {
		case <-ctx.Done():
			cause, lostAfter = context.Cause(ctx), time.Since(start)
		case <-time.After(5 * time.Second):
		}
		return nil
	}, WithTTL(ttl))
	require.ErrorIs(t, err, ErrLost)
	require.ErrorIs(t, cause, ErrLost)
	assert.NotContains(t, cause.Error(), "deadline passed", "lost at a renewal, not at the deadline")
	assert.Contains(t, cause.Error(), "expired or was deleted")
	assert.Less(t, lostAfter, ttl-drift(ttl)-50*time.Millisecond, "before the deadline")
}

func TestReplicasShortWaitStillGivesBackAWrite(t *testing.T) {
	// What the script wrote and too few replicas acknowledged is refused
	// and given back (acquire), or is a failed renewal (extend).
	t.Parallel()
	l, admin, replica := oneReplica(t, Options{})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)

	replica.Pause()
	err = lease.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged")

	name := uniqueName(t) + "-short"
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrNotObtained)
	key, _ := l.keys(name)
	require.Eventually(t, func() bool { return admin.Exists(ctx, key).Val() == 0 }, 5*time.Second, time.Millisecond,
		"given back")
}

// TestReplicasFairWaiterLeavesNoDeadEntries (bug 3): a fair waiter whose
// attempts come back short of replicas (a replica SIGSTOPped) keeps one
// live entry in line, not one per attempt with a token it dropped; the
// release after the replica resumes hands the lock to the waiter, not to a
// dead token that would hold it, with nobody, for a whole TTL.
func TestReplicasFairWaiterLeavesNoDeadEntries(t *testing.T) {
	t.Parallel()
	// ReplicaTimeout 250ms: a resumed replica acknowledges within it on a
	// loaded machine (with 20ms, the release after the resume was once
	// short of it). A dead token would hold the lock for its TTL, a
	// minute: the hand-over at the release comes well before.
	const replicaTimeout, ttl = 250 * time.Millisecond, time.Minute
	_, rs, l, admin := replicated(t, 1, &Options{Replicas: 1, ReplicaTimeout: replicaTimeout})
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(ttl))
	require.NoError(t, err)
	rs[0].Pause()
	t.Cleanup(rs[0].Resume)
	got := make(chan *Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, WithWait(2*ttl), WithFair(), WithTTL(ttl))
		if err != nil {
			t.Errorf("fair Acquire: %v", err)
		}
		got <- lease
	}()
	time.Sleep(4 * replicaTimeout) // several attempts and keep-alives, each short of the replica
	n, err := admin.ZCard(ctx, held.Key()+":q").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "one entry in line, the waiter's")
	rs[0].Resume()
	// The replica has caught up (WAIT returns when it has acknowledged
	// every write so far) before the release waits for it.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, admin.Do(wctx, "WAIT", 1, 0).Err())
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case lease := <-got:
		require.NotNil(t, lease)
		assert.Less(t, time.Since(released), ttl/2, "handed the lock at the release, not after a dead token's TTL")
		require.NoError(t, lease.Release(ctx))
	case <-time.After(ttl):
		t.Fatal("the fair waiter did not get the lock")
	}
}

// TestReplicasBusyAnswerEndsWithItsHolder (issue 34, bug 2): a waiting
// Acquire that found the lock held, then took it on every later attempt
// but short of its replica's acknowledgement, ends with ErrUnavailable,
// what it met last, not with the busy answer of a holder that has gone;
// with FailOpen its work runs degraded.
func TestReplicasBusyAnswerEndsWithItsHolder(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		t.Run(map[bool]string{false: "fail closed", true: "fail open"}[failOpen], func(t *testing.T) {
			t.Parallel()
			master, rs, _, admin := replicated(t, 1, nil)
			t.Cleanup(rs[0].Resume)
			holder, err := New(master.Client(nil), &Options{Owner: "holder-H"})
			require.NoError(t, err)
			t.Cleanup(func() { _ = holder.Close() })
			waiter, err := New(master.Client(nil), &Options{Replicas: 1, ReplicaTimeout: 50 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { _ = waiter.Close() })

			name := uniqueName(t)
			h, err := holder.Acquire(ctx, name, WithTTL(20*time.Second))
			require.NoError(t, err)
			rs[0].Pause() // from now on every WAIT comes back short

			type result struct {
				ran, degraded bool
				err           error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				if failOpen {
					r.err = waiter.RunWithLock(ctx, name, func(_ context.Context, lease *Lease) error {
						r.ran, r.degraded = true, lease.Degraded()
						return nil
					}, WithWait(3*time.Second), WithFailOpen(true))
				} else {
					_, r.err = waiter.Acquire(ctx, name, WithWait(3*time.Second))
				}
				done <- r
			}()
			// The waiter subscribes to the lock's releases after an attempt
			// that found it held.
			require.Eventually(t, func() bool {
				n, err := admin.Do(ctx, "PUBSUB", "SHARDNUMSUB", h.Key()).Slice()
				return err == nil && len(n) == 2 && n[1] == int64(1)
			}, 10*time.Second, time.Millisecond, "the waiter found the lock held")
			require.NoError(t, h.Release(ctx))

			r := <-done
			if failOpen {
				require.NoError(t, r.err)
				assert.True(t, r.ran && r.degraded, "FailOpen runs the work degraded once only the outage stands")
				return
			}
			require.ErrorIs(t, r.err, ErrUnavailable, "what the call met last")
			assert.NotErrorIs(t, r.err, ErrNotObtained, "nobody holds the lock: %v", r.err)
			assert.NotContains(t, r.err.Error(), "holder-H")
		})
	}
}
