package fencelock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// Regression tests for issue 10, section 1: the watchdog keeps a healthy
// lease. They run in synctest bubbles (see synctest_test.go) against a real
// redis-server, so the interleavings are exact and nothing sleeps through a
// TTL; the server's own TTLs run in real time and do not expire meanwhile.

// userCall marks the context of a test's own Extend, so that a hook can tell
// it from the watchdog's renewals, whose context is the watchdog's.
type userCall struct{}

var userCtx = context.WithValue(context.Background(), userCall{}, true)

func isUserCall(ctx context.Context) bool { return ctx.Value(userCall{}) != nil }

// extendCall is one run of the extend script seen by a hook.
type extendCall struct {
	user bool          // the test's Extend, not a renewal
	ttl  time.Duration // its TTL argument
	at   time.Time     // when it was sent
	err  error         // what the hook made of it
}

// extendLog records the extend scripts a client sends.
type extendLog struct {
	mu    sync.Mutex
	calls []extendCall // guarded by mu
}

func (x *extendLog) add(c extendCall) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.calls = append(x.calls, c)
}

func (x *extendLog) snapshot() []extendCall {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]extendCall(nil), x.calls...)
}

// renewals returns the watchdog's calls that the hook let through.
func (x *extendLog) renewals() []extendCall {
	var out []extendCall
	for _, c := range x.snapshot() {
		if !c.user && c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

// firstRenewal returns the index of the first call by the watchdog, or -1.
func firstRenewal(calls []extendCall) int {
	for i, c := range calls {
		if !c.user {
			return i
		}
	}
	return -1
}

// ttlArg returns the TTL argument of an extend script command, the last one.
func ttlArg(cmd redis.Cmder) time.Duration {
	args := cmd.Args()
	ms, _ := args[len(args)-1].(int64)
	return time.Duration(ms) * time.Millisecond
}

// lostRecorder collects the causes OnLost is called with.
type lostRecorder struct {
	mu     sync.Mutex
	causes []error // guarded by mu
}

func (r *lostRecorder) onLost(_ *Lease, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.causes = append(r.causes, cause)
}

func (r *lostRecorder) get() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.causes...)
}

// A KeepAlive called late, with less than an interval of the lease left,
// renews at once (by a third of what is left), not an interval after the
// call. Issue 10: 0 renewals were sent and the lease was lost 764ms later.
func TestRenewalAfterLateKeepAlive(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		var lost lostRecorder
		l := bubbleLocker(t, srv, hook, &Options{OnLost: lost.onLost})
		lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(3*time.Second))
		require.NoError(t, err)
		acquired := time.Now()
		var log extendLog
		hook.set(nil, func(ctx context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "extend" {
				log.add(extendCall{user: isUserCall(ctx), ttl: ttlArg(cmd), at: time.Now()})
			}
			return nil
		})

		time.Sleep(2200 * time.Millisecond)
		workCtx := lease.KeepAlive(ctx) // 768ms left of the 2.968s deadline, interval 1s
		time.Sleep(10 * time.Second)

		require.NoError(t, context.Cause(workCtx), "a healthy lease was lost after a late KeepAlive")
		assert.Empty(t, lost.get(), "OnLost")
		renewals := log.renewals()
		require.NotEmpty(t, renewals, "no renewal sent after a late KeepAlive")
		left := 3*time.Second - drift(3*time.Second) - 2200*time.Millisecond
		assert.LessOrEqual(t, renewals[0].at.Sub(acquired), 2200*time.Millisecond+left/3,
			"the first renewal comes by min(interval, remaining/3) after KeepAlive")
		assert.GreaterOrEqual(t, len(renewals), 9, "then one renewal a second for 10s")
		assert.True(t, time.Now().Before(lease.Deadline()), "the deadline follows the renewals")
		require.NoError(t, lease.Release(ctx))
	})
}

// A user's Extend that shortens the TTL (3s to 600ms) overlaps a renewal,
// which fails once and succeeds on retry: the watchdog must then renew by
// the new TTL's interval. Issue 10: the lease was lost 1.85s after KeepAlive
// with "deadline passed before a renewal succeeded" although one had.
func TestRenewalFollowsShorterExtendDuringFailedRenewal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		var lost lostRecorder
		l := bubbleLocker(t, srv, hook, &Options{OnLost: lost.onLost})
		lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(3*time.Second))
		require.NoError(t, err)
		workCtx := lease.KeepAlive(ctx) // renewals every second from the acquire

		var log extendLog
		gate := make(chan struct{}) // holds the user's Extend until the renewal is due
		var failedOnce atomic.Bool
		errBlip := errors.New("test: renewal failed once")
		hook.set(func(ctx context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) != "extend" {
				return nil
			}
			c := extendCall{user: isUserCall(ctx), ttl: ttlArg(cmd), at: time.Now()}
			switch {
			case c.user:
				<-gate
			case failedOnce.CompareAndSwap(false, true):
				c.err = errBlip
			}
			log.add(c)
			return c.err
		}, nil)

		time.Sleep(900 * time.Millisecond)
		extended := make(chan error, 1)
		go func() { extended <- lease.Extend(userCtx, 600*time.Millisecond) }()
		time.Sleep(200 * time.Millisecond) // the renewal falls due at 1s, behind the Extend
		synctest.Wait()
		close(gate)
		require.NoError(t, <-extended)
		extendedAt := time.Now()

		time.Sleep(2 * time.Second)
		require.NoError(t, context.Cause(workCtx), "a healthy lease was lost after a shorter Extend")
		assert.Empty(t, lost.get(), "OnLost (no 'deadline passed before a renewal succeeded')")
		calls := log.snapshot()
		first := firstRenewal(calls)
		require.Positive(t, first, "the user's Extend reached Redis before the renewal: %+v", calls)
		assert.ErrorIs(t, calls[first].err, errBlip, "the renewal that was due meanwhile failed: %+v", calls)
		var after int
		for _, c := range log.renewals() {
			if !c.at.Before(extendedAt) {
				assert.Equal(t, 600*time.Millisecond, c.ttl, "renewed by the TTL the Extend set")
				after++
			}
		}
		// 600ms TTL: a renewal every 200ms.
		assert.GreaterOrEqual(t, after, 8, "renewals in the 2s after the Extend")
		assert.True(t, time.Now().Before(lease.Deadline()))
		require.NoError(t, lease.Release(ctx))
	})
}

// A renewal that falls due while a user's Extend is in flight renews by the
// TTL that Extend set, not by the one it read before. Issue 10: after
// Extend(30s) and Extend(600ms) both returned nil, the server's PTTL and
// the Deadline were 2.9s away: the renewal wrote a stale TTL back.
func TestRenewalDoesNotUndoConcurrentExtend(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		l := bubbleLocker(t, srv, hook, nil)
		lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(3*time.Second))
		require.NoError(t, err)
		workCtx := lease.KeepAlive(ctx)
		require.NoError(t, lease.Extend(userCtx, 30*time.Second)) // next renewal 9.9s from now

		var log extendLog
		gate := make(chan struct{}) // holds the Extend(600ms) until the renewal is due
		hook.set(func(ctx context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) != "extend" {
				return nil
			}
			c := extendCall{user: isUserCall(ctx), ttl: ttlArg(cmd), at: time.Now()}
			if c.user && c.ttl == 600*time.Millisecond {
				<-gate
			}
			log.add(c)
			return nil
		}, nil)

		time.Sleep(9700 * time.Millisecond)
		extended := make(chan error, 1)
		go func() { extended <- lease.Extend(userCtx, 600*time.Millisecond) }()
		time.Sleep(400 * time.Millisecond) // the renewal falls due at 9.9s, behind the Extend
		synctest.Wait()
		close(gate)
		require.NoError(t, <-extended)
		time.Sleep(50 * time.Millisecond)

		pttl, err := call(l, "PTTL", lease.Key())
		require.NoError(t, err)
		assert.LessOrEqual(t, pttl, int64(600), "the server's TTL after Extend(600ms), in ms")
		assert.LessOrEqual(t, time.Until(lease.Deadline()), 600*time.Millisecond, "Deadline after Extend(600ms)")
		calls := log.snapshot()
		first := firstRenewal(calls)
		require.Positive(t, first, "the Extend reached Redis before the renewal that was due meanwhile: %+v", calls)
		assert.Equal(t, 600*time.Millisecond, calls[first].ttl, "the renewal's TTL: %+v", calls)
		require.NoError(t, context.Cause(workCtx))
		require.NoError(t, lease.Release(ctx))
	})
}

// Once the watchdog has reported a lease lost, Extend must not revive it:
// it returns ErrNotHeld (and ErrLost) without a Redis call, and Deadline
// stays where it was. Issue 10: after ErrLost, Extend succeeded and moved
// Deadline 59s ahead while the KeepAlive contexts were cancelled.
func TestLostLeaseStaysLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name string
		// lose makes the watchdog lose lease; the server still has it
		// unless lose deleted it.
		lose func(l *Locker, hook *faultHook, lease *Lease)
	}{
		{"deadline passed", func(_ *Locker, hook *faultHook, _ *Lease) {
			// Every renewal fails until the local deadline: the lock is
			// still on the server (its TTL runs in real time), where a
			// later Extend would find it.
			hook.set(onScript("extend", errors.New("test: connection refused")), nil)
		}},
		{"deleted", func(l *Locker, _ *faultHook, lease *Lease) {
			// The next renewal finds the lock gone.
			_, _ = call(l, "DEL", lease.Key())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hook := &faultHook{}
				var lost lostRecorder
				l := bubbleLocker(t, srv, hook, &Options{OnLost: lost.onLost})
				lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(3*time.Second))
				require.NoError(t, err)
				workCtx := lease.KeepAlive(ctx)
				tc.lose(l, hook, lease)
				<-workCtx.Done()
				require.ErrorIs(t, context.Cause(workCtx), ErrLost)
				for len(lost.get()) == 0 { // OnLost comes after the cancellation
					time.Sleep(time.Millisecond)
				}
				require.Len(t, lost.get(), 1)
				hook.set(nil, nil) // Redis is healthy again

				deadline := lease.Deadline()
				calls := hook.calls.Load()
				time.Sleep(time.Second)
				err = lease.Extend(ctx, time.Minute)
				require.ErrorIs(t, err, ErrNotHeld, "Extend of a lost lease")
				assert.ErrorIs(t, err, ErrLost, "Extend of a lost lease")
				assert.Equal(t, calls, hook.calls.Load(), "Extend of a lost lease made a Redis call")
				assert.Equal(t, deadline, lease.Deadline(), "Extend of a lost lease moved Deadline")
				assert.Len(t, lost.get(), 1, "OnLost once")
				kctx := lease.KeepAlive(ctx)
				assert.ErrorIs(t, context.Cause(kctx), ErrLost, "KeepAlive after the loss")
				_ = lease.Release(ctx) // a lease lost at its deadline may still hold the lock
			})
		})
	}
}
