package fencelock

// Issue 9, section 2: error classes that say what happened, and FailOpen
// opening on ErrUnavailable alone.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// testRedisError is an error reply of Redis, as go-redis returns it: it
// implements redis.Error.
type testRedisError string

var _ redis.Error = testRedisError("")

func (e testRedisError) Error() string { return string(e) }
func (testRedisError) RedisError()     {}

// scriptInternals are what an error message must not show: the scripts'
// SHAs (Redis 7 appends "script: <sha>", Redis 6 names the function
// "f_<sha>") and the locations in them ("@user_script:17", "user_script:1:").
func scriptInternals() []string {
	return []string{"user_script", script.Acquire.Hash.(string), script.Release.Hash.(string), script.Extend.Hash.(string)}
}

// TestClassify: every transient state of a Redis that answers is
// unavailable, every refusal is misconfigured, and a context's own error
// is no verdict; a refusal's message shows no Lua internals.
func TestClassify(t *testing.T) {
	sha := script.Acquire.Hash.(string)
	in7 := func(msg string) testRedisError { // an error a script met, as Redis 7 reports it
		return testRedisError(msg + " script: " + sha + ", on @user_script:54.")
	}
	in6 := func(msg string) testRedisError { // the same on Redis 6
		return testRedisError("ERR Error running script (call to f_" + sha + "): @user_script:54: " + msg)
	}
	for _, tc := range []struct {
		name string
		err  error
		want store.Class
	}{
		{"LOADING", testRedisError("LOADING Redis is loading the dataset in memory"), store.Unavailable},
		{"BUSY", testRedisError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), store.Unavailable},
		{"READONLY", in7("READONLY You can't write against a read only replica."), store.Unavailable},
		{"READONLY on Redis 6", in6("READONLY You can't write against a read only replica."), store.Unavailable},
		{"MASTERDOWN", testRedisError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), store.Unavailable},
		{"CLUSTERDOWN not served", testRedisError("CLUSTERDOWN Hash slot not served"), store.Unavailable},
		{"CLUSTERDOWN down", testRedisError("CLUSTERDOWN The cluster is down"), store.Unavailable},
		{"TRYAGAIN", testRedisError("TRYAGAIN Multiple keys request during rehashing of slot"), store.Unavailable},
		{"NOREPLICAS", in7("NOREPLICAS Not enough good replicas to write."), store.Unavailable},
		{"OOM", in7("OOM command not allowed when used memory > 'maxmemory'."), store.Unavailable},
		{"OOM on Redis 6", in6("OOM command not allowed when used memory > 'maxmemory'."), store.Unavailable},
		{"wrapped LOADING", fmt.Errorf("context: %w", testRedisError("LOADING Redis is loading the dataset in memory")), store.Unavailable},

		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, store.Unavailable},
		{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, store.Unavailable},
		{"dial cut by its DialTimeout", &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}, store.Unavailable},
		{"connection closed", io.EOF, store.Unavailable},
		{"pool timeout", redis.ErrPoolTimeout, store.Unavailable},

		{"NOAUTH", testRedisError("NOAUTH Authentication required."), store.Misconfigured},
		{"unauthenticated long command", testRedisError("ERR Protocol error: unauthenticated multibulk length"), store.Misconfigured},
		{"WRONGPASS", testRedisError("WRONGPASS invalid username-password pair or user is disabled."), store.Misconfigured},
		{"NOPERM command", testRedisError("NOPERM this user has no permissions to run the 'evalsha' command"), store.Misconfigured},
		{"NOPERM key", testRedisError("NOPERM this user has no permissions to access one of the keys used as arguments"), store.Misconfigured},
		{"NOPERM in a script", in7("NOPERM this user has no permissions to access one of the keys used as arguments"), store.Misconfigured},
		{"WRONGTYPE", in7("WRONGTYPE Operation against a key holding the wrong kind of value"), store.Misconfigured},
		{"WRONGTYPE on Redis 6", in6("WRONGTYPE Operation against a key holding the wrong kind of value"), store.Misconfigured},
		{"unknown command", testRedisError("ERR unknown command 'evalsha', with args beginning with: '" + sha + "' '3' 'lock:{x}' "), store.Misconfigured},
		{"script error", in7("ERR value is not an integer or out of range"), store.Misconfigured},
		{"script error on Redis 6", in6("ERR value is not an integer or out of range"), store.Misconfigured},
		{"script runtime error", testRedisError("ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: " + sha + ", on @user_script:1."), store.Misconfigured},
		{"closed client", &store.Refusal{Msg: "the go-redis client is closed", Err: redis.ErrClosed, NotSent: true}, store.Misconfigured},
		{"reply not understood", fmt.Errorf("%w from the acquire script: [7]", store.ErrReply), store.Misconfigured},

		{"context canceled", context.Canceled, store.NoVerdict},
		{"context deadline", context.DeadlineExceeded, store.NoVerdict},
		{"wrapped context deadline", fmt.Errorf("redis: %w", context.DeadlineExceeded), store.NoVerdict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, classify(tc.err), "classify(%q)", tc.err)
			if tc.want == store.NoVerdict {
				return
			}
			err := callError("x", tc.err)
			msg := err.Error()
			assert.NotContains(t, msg, "\n", "one line")
			if tc.want == store.Unavailable {
				assert.ErrorIs(t, err, ErrUnavailable)
				assert.NotErrorIs(t, err, ErrMisconfigured)
				return
			}
			assert.ErrorIs(t, err, ErrMisconfigured)
			assert.NotErrorIs(t, err, ErrUnavailable)
			for _, s := range scriptInternals() {
				assert.NotContains(t, msg, s, "a refusal's message shows no Lua internals")
			}
		})
	}
}

// checkUnavailable checks that the locks of c are unavailable, with the
// error text showing cause: Acquire returns ErrUnavailable and nothing else
// of this package's classes, RunWithLock does not run the work, and with
// FailOpen it runs it on a degraded lease.
func checkUnavailable(t *testing.T, c *redis.Client, name, cause string) {
	t.Helper()
	l, err := New(c, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	open, err := New(c, &Options{FailOpen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = open.Close() })

	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrMisconfigured)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Contains(t, err.Error(), cause)
	assert.NotContains(t, err.Error(), "\n", "one line")

	ran := false
	err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, ran, "fail-closed: the work does not run")

	degraded := false
	err = open.RunWithLock(ctx, name, func(_ context.Context, lease *Lease) error {
		ran, degraded = true, lease.Degraded()
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ran, "fail-open opens on ErrUnavailable")
	assert.True(t, degraded, "on a degraded lease")
}

// noRetries are client options for a Redis in a transient state: go-redis
// retries some of them (LOADING, TRYAGAIN, CLUSTERDOWN) with backoff, which
// only slows the test.
func noRetries() *redis.Options { return &redis.Options{MaxRetries: -1} }

// pollUntil polls cond every 10ms for up to d, and fails the test with its
// last error.
func pollUntil(t *testing.T, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTransientStatesAreUnavailable: Redis could not be reached, did not
// answer in time, or answered with a transient state (LOADING, BUSY,
// READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, OOM), each
// produced on a real redis-server: ErrUnavailable, and FailOpen opens.
func TestTransientStatesAreUnavailable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cause string // in the error's text
		setup func(t *testing.T, name string) *redis.Client
	}{
		{"nothing listening", "connection refused", func(t *testing.T, _ string) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}},
		{"no answer within ReadTimeout", "i/o timeout", func(t *testing.T, _ string) *redis.Client {
			srv := redistest.Start(t)
			c := srv.Client(&redis.Options{MaxRetries: -1, ReadTimeout: 100 * time.Millisecond})
			require.NoError(t, c.Ping(ctx).Err())
			pause(t, srv)
			return c
		}},
		{"LOADING", "LOADING", func(t *testing.T, _ string) *redis.Client {
			srv := redistest.Start(t, "--enable-debug-command", "yes")
			for _, cmd := range [][]any{
				{"CONFIG", "SET", "key-load-delay", "1000"}, // microseconds per key
				{"CONFIG", "SET", "loading-process-events-interval-bytes", "1024"},
				{"DEBUG", "POPULATE", "2000"},
			} {
				_, err := srv.Do(cmd...)
				require.NoError(t, err)
			}
			c := srv.Client(noRetries())
			reloaded := make(chan struct{})
			go func() {
				defer close(reloaded)
				_, _ = srv.Do("DEBUG", "RELOAD") // about 2s of loading, answering LOADING meanwhile
			}()
			t.Cleanup(func() { <-reloaded })
			pollUntil(t, 3*time.Second, func() error {
				info, err := srv.Do("INFO", "persistence")
				if err != nil {
					return err
				}
				if s, _ := info.(string); !strings.Contains(s, "loading:1") {
					return errors.New("not loading yet")
				}
				return nil
			})
			return c
		}},
		{"BUSY", "BUSY", func(t *testing.T, _ string) *redis.Client {
			srv := redistest.Start(t)
			_, err := srv.Do("CONFIG", "SET", "busy-reply-threshold", "50")
			require.NoError(t, err)
			c := srv.Client(noRetries())
			busy := make(chan struct{})
			go func() {
				defer close(busy)
				_, _ = srv.Do("EVAL", "while true do end", "0")
			}()
			t.Cleanup(func() {
				_, _ = srv.Do("SCRIPT", "KILL")
				<-busy
			})
			pollUntil(t, 3*time.Second, func() error {
				_, err := srv.Do("PING")
				if err == nil || !strings.HasPrefix(err.Error(), "BUSY") {
					return fmt.Errorf("not busy yet: %v", err)
				}
				return nil
			})
			return c
		}},
		{"READONLY", "READONLY", func(t *testing.T, _ string) *redis.Client {
			replica := redistest.StartReplica(t, redistest.Start(t))
			return replica.Client(noRetries())
		}},
		{"MASTERDOWN", "MASTERDOWN", func(t *testing.T, _ string) *redis.Client {
			master := redistest.Start(t)
			replica := redistest.StartReplica(t, master, "--replica-serve-stale-data", "no")
			master.Kill()
			pollUntil(t, 5*time.Second, func() error {
				if st := replica.Info("replication")["master_link_status"]; st != "down" {
					return fmt.Errorf("master_link_status:%s", st)
				}
				return nil
			})
			return replica.Client(noRetries())
		}},
		{"CLUSTERDOWN", "CLUSTERDOWN", func(t *testing.T, name string) *redis.Client {
			node := redistest.StartCluster(t)
			slot, err := node.Do("CLUSTER", "KEYSLOT", "lock:{"+name+"}")
			require.NoError(t, err)
			_, err = node.Do("CLUSTER", "DELSLOTS", slot) // the node serves no slot of the lock
			require.NoError(t, err)
			return node.Client(noRetries())
		}},
		{"TRYAGAIN", "TRYAGAIN", func(t *testing.T, name string) *redis.Client {
			cluster := redistest.StartClusterN(t, 2, 0)
			slot, err := cluster.Masters[0].Do("CLUSTER", "KEYSLOT", "lock:{"+name+"}")
			require.NoError(t, err)
			from, to := cluster.MasterOf(int(slot.(int64))), cluster.Masters[0]
			if to == from {
				to = cluster.Masters[1]
			}
			// The slot is migrating and holds the fence counter but not the
			// lock: a script on both keys is told to try again.
			_, err = from.Do("SET", "lock:{"+name+"}:fence", "1")
			require.NoError(t, err)
			_, err = from.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.NodeID(to))
			require.NoError(t, err)
			return from.Client(noRetries())
		}},
		{"NOREPLICAS", "NOREPLICAS", func(t *testing.T, _ string) *redis.Client {
			return redistest.Start(t, "--min-replicas-to-write", "1").Client(noRetries())
		}},
		{"OOM", "OOM", func(t *testing.T, _ string) *redis.Client {
			return redistest.Start(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction").Client(noRetries())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			checkUnavailable(t, tc.setup(t, name), name, tc.cause)
		})
	}
}

// TestMisconfiguredIsNotRetriedNorFailsOpen: Redis answered but refuses the
// lock's commands. Acquire returns ErrMisconfigured at once (a WithWait does
// not retry it), with a one-line message that says what to fix and shows no
// Lua internals, and FailOpen does not run the work.
func TestMisconfiguredIsNotRetriedNorFailsOpen(t *testing.T) {
	t.Parallel()
	aclUser := func(t *testing.T, rules ...any) *redis.Client {
		t.Helper()
		srv := redistest.Start(t)
		_, err := srv.Do(append([]any{"ACL", "SETUSER", "app", "on", ">pw"}, rules...)...)
		require.NoError(t, err)
		return srv.Client(&redis.Options{Username: "app", Password: "pw"})
	}
	withKey := func(t *testing.T, args ...any) *redis.Client {
		t.Helper()
		srv := redistest.Start(t)
		_, err := srv.Do(args...)
		require.NoError(t, err)
		return srv.Client(nil)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, name string) *redis.Client
		code  string // in the message: what Redis said
		fix   func(name string) string
	}{
		{"NOAUTH", func(t *testing.T, _ string) *redis.Client {
			srv := redistest.Start(t)
			_, err := srv.Do("CONFIG", "SET", "requirepass", "secret")
			require.NoError(t, err)
			return srv.Client(nil)
		}, "NOAUTH", func(string) string { return "Password" }},
		{"WRONGPASS", func(t *testing.T, _ string) *redis.Client {
			srv := redistest.Start(t)
			_, err := srv.Do("CONFIG", "SET", "requirepass", "secret")
			require.NoError(t, err)
			return srv.Client(&redis.Options{Password: "wrong"})
		}, "WRONGPASS", func(string) string { return "Password" }},
		{"NOPERM without scripting", func(t *testing.T, _ string) *redis.Client {
			return aclUser(t, "~*", "&*", "+@all", "-@scripting")
		}, "NOPERM", func(string) string { return "ACL" }},
		{"NOPERM outside the key patterns", func(t *testing.T, _ string) *redis.Client {
			return aclUser(t, "~other:*", "&*", "+@all")
		}, "NOPERM", func(string) string { return "ACL" }},
		{"WRONGTYPE on the lock key", func(t *testing.T, name string) *redis.Client {
			return withKey(t, "HSET", "lock:{"+name+"}", "a", "b")
		}, "WRONGTYPE", func(name string) string { return name }},
		{"WRONGTYPE on the fence key", func(t *testing.T, name string) *redis.Client {
			return withKey(t, "HSET", "lock:{"+name+"}:fence", "a", "b")
		}, "WRONGTYPE", func(name string) string { return name }},
		{"unknown command", func(t *testing.T, _ string) *redis.Client {
			return redistest.Start(t, "--rename-command", "evalsha", "", "--rename-command", "eval", "").Client(nil)
		}, "unknown command", func(string) string { return "scripting" }},
		{"script error", func(t *testing.T, name string) *redis.Client {
			// A fence counter that is not a number (and longer than the
			// server's clock in microseconds): INCR fails in the script.
			return withKey(t, "SET", "lock:{"+name+"}:fence", "not a number, and a long one")
		}, "not an integer", func(name string) string { return name }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := uniqueName(t)
			c := tc.setup(t, name)
			l, err := New(c, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			open, err := New(c, &Options{FailOpen: true})
			require.NoError(t, err)
			t.Cleanup(func() { _ = open.Close() })

			ran := false
			err = open.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil })
			assert.False(t, ran, "FailOpen never opens on a refusal")
			assert.ErrorIs(t, err, ErrMisconfigured, "RunWithLock")

			start := time.Now()
			_, err = l.Acquire(ctx, name, WithWait(2*time.Second))
			elapsed := time.Since(start)
			require.ErrorIs(t, err, ErrMisconfigured)
			assert.Less(t, elapsed, time.Second, "not retried: retrying does not help")
			assert.NotErrorIs(t, err, ErrUnavailable)
			assert.NotErrorIs(t, err, ErrNotObtained)
			msg := err.Error()
			assert.NotContains(t, msg, "\n", "one line")
			assert.Contains(t, msg, tc.code, "says what Redis refused")
			assert.Contains(t, msg, tc.fix(name), "says what to fix")
			for _, s := range scriptInternals() {
				assert.NotContains(t, msg, s, "shows no Lua internals")
			}
		})
	}

	t.Run("NOPERM after acquiring", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		_, err := srv.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all")
		require.NoError(t, err)
		l, err := New(srv.Client(&redis.Options{Username: "app", Password: "pw"}), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		lease, err := l.Acquire(ctx, uniqueName(t))
		require.NoError(t, err)

		_, err = srv.Do("ACL", "SETUSER", "app", "-@scripting")
		require.NoError(t, err)
		err = lease.Extend(ctx, time.Minute)
		require.ErrorIs(t, err, ErrMisconfigured)
		assert.NotErrorIs(t, err, ErrUnavailable)
		err = lease.Release(ctx)
		require.ErrorIs(t, err, ErrMisconfigured)
		assert.NotErrorIs(t, err, ErrUnavailable)
		for _, s := range scriptInternals() {
			assert.NotContains(t, err.Error(), s, "shows no Lua internals")
		}
	})
}

// TestWithWaitTinyOnFreeLock: WithWait bounds the waiting between attempts,
// never an attempt in flight, so a tiny wait on a free lock of a healthy
// Redis always obtains it.
func TestWithWaitTinyOnFreeLock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts redis.Options
		wait time.Duration
		n    int
	}{
		{"1µs", redis.Options{}, time.Microsecond, 50},
		{"1µs with ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}, time.Microsecond, 50},
		{"50µs with ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}, 50 * time.Microsecond, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			l := e.locker(t, nil)
			name := uniqueName(t)
			var failures []error
			for range tc.n {
				lease, err := l.Acquire(ctx, name, WithWait(tc.wait))
				if err != nil {
					failures = append(failures, err)
					continue
				}
				require.NoError(t, lease.Release(ctx))
			}
			assert.Empty(t, failures, "%d of %d Acquire calls failed on a free lock", len(failures), tc.n)
		})
	}
}

// TestFailOpenNeverRunsDegradedWhileHeld: with the lock held by another
// client on a healthy Redis, a fail-open RunWithLock is not obtained, and
// never runs its work without the lock, however short its wait.
func TestFailOpenNeverRunsDegradedWhileHeld(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts redis.Options
		call []Option
	}{
		{"try once", redis.Options{}, nil},
		{"WithWait(1µs)", redis.Options{}, []Option{WithWait(time.Microsecond)}},
		{"WithWait(50µs) with ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}, []Option{WithWait(50 * time.Microsecond)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			holder, err := New(e.admin, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = holder.Close() })
			l := e.locker(t, &Options{FailOpen: true})
			name := uniqueName(t)
			held, err := holder.Acquire(ctx, name)
			require.NoError(t, err)

			degraded := 0
			for range 20 {
				err := l.RunWithLock(ctx, name, func(context.Context, *Lease) error { degraded++; return nil }, tc.call...)
				assert.ErrorIs(t, err, ErrNotObtained)
				assert.NotErrorIs(t, err, ErrUnavailable)
			}
			assert.Zero(t, degraded, "the work ran without the lock while another client held it")
			require.NoError(t, held.Release(ctx))
		})
	}
}

// TestCtxEndedErrors: a ctx that ends before Redis gave any verdict gives an
// error matching ctx.Err() and neither ErrNotObtained nor ErrUnavailable
// (an already cancelled ctx too), and FailOpen does not open on it; a
// fail-open call's attempt ends at half the time left, so that its work
// runs degraded before the deadline; a busy lock seen before ctx ended
// gives ErrNotObtained and ctx.Err().
func TestCtxEndedErrors(t *testing.T) {
	t.Parallel()
	work := func(ran *bool) func(context.Context, *Lease) error {
		return func(context.Context, *Lease) error { *ran = true; return nil }
	}

	t.Run("paused server", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		l := e.locker(t, nil)
		// Its attempts end at half the time left (AttemptTimeout is
		// longer): 2s of a 4s deadline, leaving 2s to decide and run the
		// work. With 100ms of 200ms, a busy machine's pause left none.
		open := e.locker(t, &Options{FailOpen: true, AttemptTimeout: time.Minute})
		name := uniqueName(t)
		require.NoError(t, e.client.Ping(ctx).Err())
		pause(t, e.srv)

		_, err := l.Acquire(withTimeout(t, 200*time.Millisecond), name)
		requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire")
		_, err = l.Acquire(withTimeout(t, 200*time.Millisecond), name, WithWait(time.Second))
		requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire with WithWait")

		c, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(100*time.Millisecond, cancel)
		defer timer.Stop()
		_, err = l.Acquire(c, name, WithWait(time.Minute))
		requireNoVerdict(t, err, context.Canceled, "cancelled Acquire")

		ran := false
		err = open.RunWithLock(withTimeout(t, 4*time.Second), name, work(&ran))
		require.NoError(t, err, "RunWithLock")
		assert.True(t, ran, "FailOpen: the attempt ended at 2s, half the time left, and the work ran degraded")
	})

	t.Run("already ended", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		l := e.locker(t, nil)
		open := e.locker(t, &Options{FailOpen: true})
		name := uniqueName(t)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel2()

		for _, tc := range []struct {
			name string
			ctx  context.Context
			want error
		}{
			{"cancelled", cancelled, context.Canceled},
			{"deadline passed", expired, context.DeadlineExceeded},
		} {
			_, err := l.Acquire(tc.ctx, name)
			requireNoVerdict(t, err, tc.want, tc.name+" Acquire")
			_, err = l.Acquire(tc.ctx, name, WithWait(time.Minute))
			requireNoVerdict(t, err, tc.want, tc.name+" Acquire with WithWait")
			ran := false
			err = open.RunWithLock(tc.ctx, name, work(&ran))
			requireNoVerdict(t, err, tc.want, tc.name+" RunWithLock")
			assert.False(t, ran, "%s: the work does not run", tc.name)
		}
		key, _ := l.keys(name)
		assert.False(t, keyExists(t, e.srv, key), "no lock taken")
	})

	t.Run("busy then ended", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		l := e.locker(t, nil)
		open := e.locker(t, &Options{FailOpen: true})
		name := uniqueName(t)
		held, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = held.Release(ctx) })

		_, err = l.Acquire(withTimeout(t, 200*time.Millisecond), name, WithWait(time.Minute))
		require.ErrorIs(t, err, ErrNotObtained)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, ErrUnavailable)
		assert.NotContains(t, err.Error(), "\n", "one line")

		c, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(100*time.Millisecond, cancel)
		defer timer.Stop()
		ran := false
		err = open.RunWithLock(c, name, work(&ran), WithWait(time.Minute))
		require.ErrorIs(t, err, ErrNotObtained)
		assert.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, ErrUnavailable)
		assert.NotContains(t, err.Error(), "\n", "one line")
		assert.False(t, ran)
	})
}

// TestErrorTextKeepsRootCause: with nothing listening, the error is one line
// and says "connection refused", however the call ended.
func TestErrorTextKeepsRootCause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
		call []Option
		want error // the error also matches
	}{
		{"try once", func(*testing.T) context.Context { return ctx }, nil, ErrUnavailable},
		{"WithWait", func(*testing.T) context.Context { return ctx }, []Option{WithWait(300 * time.Millisecond)}, ErrUnavailable},
		{"ctx deadline before go-redis gave up", func(t *testing.T) context.Context { return withTimeout(t, 300*time.Millisecond) },
			nil, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := refusedClient(t, closedAddr(t))
			l, err := New(c, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			_, err = l.Acquire(tc.ctx(t), uniqueName(t), tc.call...)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.NotErrorIs(t, err, ErrNotObtained)
			assert.NotContains(t, err.Error(), "\n", "one line")
			assert.Contains(t, err.Error(), "connection refused", "the root cause is kept")
		})
	}
}

// TestReleaseTimeoutIsNotTheCallersDeadline: a Release that ran out of
// ReleaseTimeout says so, returns by it, and does not match the caller's
// context.DeadlineExceeded.
func TestReleaseTimeoutIsNotTheCallersDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts redis.Options
	}{
		{"ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}},
		{"go-redis defaults", redis.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			const releaseTimeout = 300 * time.Millisecond
			l := e.locker(t, &Options{ReleaseTimeout: releaseTimeout})
			name := uniqueName(t)
			a, err := l.Acquire(ctx, name+".a")
			require.NoError(t, err)
			b, err := l.Acquire(ctx, name+".b")
			require.NoError(t, err)
			pause(t, e.srv)

			for _, rc := range []struct {
				what  string
				lease *Lease
				ctx   context.Context
			}{
				{"Release(ctx without deadline)", a, ctx},
				{"Release(ctx with a 1 minute deadline)", b, withTimeout(t, time.Minute)},
			} {
				err := returnsBy(t, releaseTimeout, rc.what, func() error { return rc.lease.Release(rc.ctx) })
				require.ErrorIs(t, err, ErrUnavailable, rc.what)
				assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s: the caller's deadline did not pass", rc.what)
				assert.Contains(t, err.Error(), "ReleaseTimeout", "%s: says it ran out of ReleaseTimeout", rc.what)
				assert.NotContains(t, err.Error(), "\n", "one line")
			}
		})
	}
}

// TestNumbersThatCannotWorkAreInvalid: a TTL that overflows, one too short
// for any renewal, and a negative one are ErrInvalid before any Redis call,
// and FailOpen does not open on them.
func TestNumbersThatCannotWorkAreInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, &Options{FailOpen: true})
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name+".held")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(ctx) })

	for _, tc := range []struct {
		name string
		ttl  time.Duration
		msg  string
	}{
		{"math.MaxInt64", math.MaxInt64, ""},
		{"3ms", 3 * time.Millisecond, ""},
		{"negative", -time.Second, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.hook.calls.Load()
			checkInvalid := func(err error, what string) {
				t.Helper()
				require.ErrorIs(t, err, ErrInvalid, what)
				assert.NotErrorIs(t, err, ErrUnavailable, what)
				assert.Contains(t, err.Error(), tc.msg, what)
			}
			_, err := l.Acquire(ctx, name, WithTTL(tc.ttl))
			checkInvalid(err, "Acquire WithTTL")
			ran := false
			err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil }, WithTTL(tc.ttl))
			checkInvalid(err, "RunWithLock WithTTL")
			assert.False(t, ran, "FailOpen does not open on ErrInvalid")
			checkInvalid(lease.Extend(ctx, tc.ttl), "Extend")
			_, err = New(e.client, &Options{TTL: tc.ttl})
			checkInvalid(err, "Options.TTL")
			assert.Equal(t, before, e.hook.calls.Load(), "no Redis call")
		})
	}
}

// instantTimers is a Clock whose timers fire at once: a waiting Acquire
// goes through its backoff as fast as Redis answers.
type instantTimers struct{}

func (instantTimers) Now() time.Time                     { return time.Now() }
func (instantTimers) NewTimer(time.Duration) *time.Timer { return time.NewTimer(0) }

// TestHugeMaxRetryBackoffDoesNotPanic: MaxRetryBackoff math.MaxInt64 is
// either rejected with ErrInvalid or works: a waiting Acquire on a busy
// lock goes through many backoff steps (its timers fire at once) without
// the backoff overflowing.
func TestHugeMaxRetryBackoffDoesNotPanic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l, err := New(e.client, &Options{MinRetryBackoff: time.Millisecond, MaxRetryBackoff: math.MaxInt64, Clock: instantTimers{}})
	if err != nil {
		require.ErrorIs(t, err, ErrInvalid)
		return
	}
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	// The wait ends once the attempts are enough for the backoff to have
	// doubled past MaxInt64: an event, not a time (a loaded machine made
	// 62 attempts in 300ms).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var acquires atomic.Int64
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" && acquires.Add(1) > 64 {
			cancel()
		}
		return nil
	})
	_, err = l.Acquire(wctx, name, WithWait(time.Minute))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Greater(t, acquires.Load(), int64(64), "enough attempts for the backoff to have doubled past MaxInt64")
	require.NoError(t, held.Release(ctx))

}
