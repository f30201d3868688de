package fencelock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/notify"
)

// A backoff so long that a waiter woken in time can only have been woken by
// the release's pub/sub message.
var slowPolling = &Options{MinRetryBackoff: 20 * time.Second, MaxRetryBackoff: 20 * time.Second}

// pubsubClients returns how many connections of the server are in pub/sub
// mode.
func pubsubClients(t *testing.T, e *env) int {
	t.Helper()
	list, err := e.admin.ClientList(ctx).Result()
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if (strings.HasPrefix(f, "sub=") && f != "sub=0") || (strings.HasPrefix(f, "ssub=") && f != "ssub=0") {
				n++
				break
			}
		}
	}
	return n
}

// waitInBackground acquires name with a one-minute wait, releases it, and
// sends the outcome.
func waitInBackground(l *Locker, name string) <-chan error {
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, WithWait(time.Minute))
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	return got
}

// requireObtained waits up to d for waitInBackground's outcome.
func requireObtained(t *testing.T, got <-chan error, d time.Duration, msg string) {
	t.Helper()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatal(msg)
	}
}

func TestReleaseWakesWaiter(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	got := make(chan time.Time, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, WithWait(time.Minute))
		if !assert.NoError(t, err) {
			got <- time.Time{}
			return
		}
		obtained := time.Now()
		assert.NoError(t, lease.Release(ctx))
		got <- obtained // last: the test waits for this goroutine's asserts
	}()
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond, "the waiter subscribes")
	time.Sleep(50 * time.Millisecond)
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	obtained := <-got
	require.False(t, obtained.IsZero())
	assert.Less(t, obtained.Sub(released), 5*time.Second, "woken by the release, not by the 10-20s backoff nor the 1 minute TTL")
	assert.Equal(t, 1, openHubs(l), "the subscription connection lingers after the last waiter left")
	require.NoError(t, l.Close())
	assert.Zero(t, openHubs(l), "Close closes it")
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 0 }, 5*time.Second, 10*time.Millisecond,
		"Close closes the subscription connection")
}

func TestWaitersShareOneSubscription(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	const locks, perLock = 4, 3
	var held []*Lease
	for i := range locks {
		lease, err := l.Acquire(ctx, uniqueName(t)+strings.Repeat("x", i))
		require.NoError(t, err)
		held = append(held, lease)
	}
	var wg sync.WaitGroup
	for _, h := range held {
		for range perLock {
			wg.Go(func() {
				lease, err := l.Acquire(ctx, h.Name(), WithWait(time.Minute))
				if assert.NoError(t, err) {
					time.Sleep(time.Millisecond)
					assert.NoError(t, lease.Release(ctx))
				}
			})
		}
	}
	// Every waiter is subscribed once its channel is: count the channels.
	require.Eventually(t, func() bool {
		chans, err := e.admin.PubSubShardChannels(ctx, "*").Result()
		return err == nil && len(chans) == locks
	}, 5*time.Second, time.Millisecond)
	assert.Equal(t, 1, pubsubClients(t, e), "12 waiters on 4 locks share one connection")

	start := time.Now()
	for _, h := range held {
		require.NoError(t, h.Release(ctx))
	}
	wg.Wait() // each release hands over to a waiter, whose release wakes the next
	assert.Less(t, time.Since(start), 10*time.Second, "all hand-overs by wake-up, none by the 10-20s backoff")
	require.NoError(t, l.Close())
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestWaiterSurvivesDroppedSubscription(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	got := waitInBackground(l, name)
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond)
	// Drop the subscription connection; the waiter's client reconnects and
	// subscribes again.
	require.NoError(t, e.admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond, "resubscribed")
	time.Sleep(20 * time.Millisecond)
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 10*time.Second, "the waiter was not woken after its subscription was dropped")
	assert.Less(t, time.Since(released), 5*time.Second)
}

func TestWaiterSurvivesRedisRestart(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	l := e.locker(t, &Options{MinRetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 500 * time.Millisecond})
	name := uniqueName(t)
	_, err := l.Acquire(ctx, name, WithTTL(time.Hour)) // held for an hour, never released
	require.NoError(t, err)

	got := waitInBackground(l, name)
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond)
	// Without persistence a restart loses the lock: the waiter, which keeps
	// trying through the outage, must get it without waiting for the hour.
	e.srv.Restart()
	requireObtained(t, got, 15*time.Second, "the waiter stalled after a Redis restart")
}

func TestWaitUnavailableThroughout(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	l := e.locker(t, &Options{ReleaseTimeout: 100 * time.Millisecond})
	e.srv.Kill()
	start := time.Now()
	_, err := l.Acquire(ctx, uniqueName(t), WithWait(500*time.Millisecond))
	require.ErrorIs(t, err, ErrUnavailable, "Redis down for the whole wait")
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Less(t, time.Since(start), 3*time.Second, "bounded by the wait")
}

func TestMiniredisFallsBackToClassicPubSub(t *testing.T) {
	m, l := newMini(t)
	c2 := redis.NewClient(&redis.Options{Addr: m.Addr()})
	l2, err := New(c2, slowPolling)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l2.Close(); _ = c2.Close() })
	held, err := l.Acquire(ctx, "job", WithTTL(time.Minute))
	require.NoError(t, err)
	got := waitInBackground(l2, "job")
	require.Eventually(t, func() bool { return len(m.PubSubChannels("*")) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 5*time.Second, "no wake-up through PUBLISH/SUBSCRIBE")
}

func TestCancelWhileSubscriptionHangs(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	// Freeze the server right after the waiter's first (busy) attempt: the
	// subscription connection that the wait then opens hangs.
	afterFirstAcquire(e, e.srv.Pause)
	t.Cleanup(e.srv.Resume)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(cctx, name, WithWait(time.Minute))
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second, "ctx ends the wait although the subscription hangs")
	e.srv.Resume()
	e.hook.set(nil, nil)
	require.NoError(t, held.Release(ctx))
}

func TestReleaseBeforeSubscriptionIsNotMissed(t *testing.T) {
	// The holder releases between the waiter's first (busy) attempt and its
	// subscription: the attempt that follows the confirmed subscription
	// finds the lock free, without waiting for the 10-20s backoff.
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	afterFirstAcquire(e, func() {
		assert.NoError(t, held.Release(ctx)) // before register runs; not require: another goroutine
	})
	requireObtained(t, waitInBackground(l, name), 5*time.Second, "the release before the subscription was missed")
}

// afterFirstAcquire runs f once, right after the next acquire script's reply
// arrives and before Acquire sees it.
func afterFirstAcquire(e *env, f func()) {
	var once sync.Once
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" {
			once.Do(f)
		}
		return nil
	})
}

// A fair wait that comes soon after another on the same lock finds the
// channel still subscribed: the wake-up its registration signals is drained
// before its first attempt, which answers for every release before it, so
// no keep-alive follows (before channel lingering, the confirmation of a
// new subscription came after the attempt and cost a keep-alive), and the
// release still hands it the lock.
func TestFairWaitSoonAfterAWaitStartsSubscribed(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	holder, err := New(e.admin, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	name := uniqueName(t)
	channel := "lock:{" + name + "}"
	var scripts atomic.Int64 // acquire and queue scripts of l that Redis ran
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if n := scriptName(cmd); n == "acquire" || n == "queue" {
			scripts.Add(1)
		}
		return nil
	})
	wait := func(round int) {
		t.Helper()
		held, err := holder.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		scripts.Store(0)
		got := make(chan *Lease, 1)
		go func() {
			// TTL 1 minute: keep-alives every 500ms.
			lease, err := l.Acquire(ctx, name, WithWait(time.Minute), WithTTL(time.Minute), WithFair())
			assert.NoError(t, err)
			got <- lease
		}()
		require.Eventually(t, func() bool { return waitsOf(l).Subscribed(channel) && scripts.Load() >= 1 },
			5*time.Second, time.Millisecond, "subscribed, and the attempt made")
		time.Sleep(200 * time.Millisecond) // a keep-alive for the confirmation would come now
		if round == 2 {
			assert.Equal(t, int64(1), scripts.Load(), "round 2: requests before the release")
		} else {
			// Most often 2: the attempt, and a keep-alive for a
			// confirmation that came after it (1 if it came before).
			t.Logf("round 1: %d requests before the release", scripts.Load())
		}
		require.NoError(t, held.Release(ctx))
		var lease *Lease
		select {
		case lease = <-got:
			require.NotNil(t, lease)
		case <-time.After(5 * time.Second):
			t.Fatal("not granted the lock by the release")
		}
		// Release it, and wait until l has read the release's message on
		// its lingering subscription: read later, it would wake the next
		// round's waiter after its attempt.
		seen := waitsOf(l).Register(channel, nil, &grantee{token: "observer", granted: make(chan int64, 1)})
		require.NotNil(t, seen)
		<-seen.C() // subscribed: signalled at once
		require.NoError(t, lease.Release(ctx))
		select {
		case <-seen.C():
		case <-time.After(5 * time.Second):
			t.Fatal("the release's message did not arrive")
		}
		seen.Leave()
	}
	wait(1)
	wait(2) // within notify.ChannelLinger
}

// A channel stays subscribed for notify.ChannelLinger after its last waiter
// left if that was a fair one, then its hub unsubscribes it; the hub itself
// closes after its own linger. After a plain wait it does not linger
// (internal/notify's TestChannelLingersThenEnds checks that no state is
// kept for it).
func TestChannelLingersThenEnds(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	waitsOf(l).SetLinger(300 * time.Millisecond) // the hub's; the channel's is notify.ChannelLinger
	name := uniqueName(t)
	channel := "lock:{" + name + "}"
	wait := func(opts ...Option) time.Time {
		t.Helper()
		held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			lease, err := l.Acquire(ctx, name, append(opts, WithWait(time.Minute))...)
			if err == nil {
				err = lease.Release(ctx)
			}
			got <- err
		}()
		require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, channel) == 1 }, 5*time.Second, time.Millisecond)
		require.NoError(t, held.Release(ctx))
		requireObtained(t, got, 5*time.Second, "not woken")
		return time.Now()
	}

	left := wait(WithFair())
	assert.True(t, waitsOf(l).Subscribed(channel), "still subscribed just after the last waiter left")
	assert.Equal(t, int64(1), shardSubscribers(t, e.srv, channel))
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Waiters, "Inspect counts the lingering subscription, as LockInfo says")
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, channel) == 0 }, 5*time.Second, 5*time.Millisecond,
		"unsubscribed after the channel's linger")
	assert.GreaterOrEqual(t, time.Since(left), notify.ChannelLinger-100*time.Millisecond, "not before the linger")
	assert.False(t, waitsOf(l).Subscribed(channel))
	info, err = l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Zero(t, info.Waiters, "not after the linger")

	left = wait()
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, channel) == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Less(t, time.Since(left), notify.ChannelLinger/2, "a plain wait's channel does not linger")
	require.Eventually(t, func() bool { return openHubs(l) == 0 }, 5*time.Second, 10*time.Millisecond, "the hub closes after its linger")
}

// countAcquires counts the acquire scripts (a lock's, a semaphore's) e's
// client sends from now on.
func countAcquires(e *env) *atomic.Int64 {
	var n atomic.Int64
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if name := scriptName(cmd); name == "acquire" || name == "semaphore_acquire" {
			n.Add(1)
		}
		return nil
	}, nil)
	return &n
}

// A release wakes one of a Locker's plain waiters, not all: each hand-over
// costs one attempt, where waking every waiter would cost one per waiter
// still waiting (here 6+5+4+3+2+1 = 21 against 6).
func TestReleaseWakesOneWaiter(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling) // no attempt by backoff within the test
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	attempts := countAcquires(e)
	const waiters = 6
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, name, WithWait(time.Minute), WithTTL(time.Minute))
			if assert.NoError(t, err) {
				time.Sleep(2 * time.Millisecond)
				assert.NoError(t, lease.Release(ctx))
			}
		})
	}
	// Each waiter tries once, finds the lock busy, subscribes, and tries
	// again when its subscription is confirmed.
	require.Eventually(t, func() bool { return attempts.Load() == 2*waiters }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.EqualValues(t, 2*waiters, attempts.Load())
	attempts.Store(0)
	require.NoError(t, held.Release(ctx))
	wg.Wait()
	assert.LessOrEqual(t, attempts.Load(), int64(waiters+1), "one attempt per hand-over")
}

// A woken waiter whose attempt neither takes the lock nor finds it held
// passes the wake-up on: the next waiter tries at once, not after its
// backoff (20s here).
func TestWakeUpPassedOnAfterAFailedAttempt(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	attempts := countAcquires(e)
	results := make(chan error, 2)
	for i := range 2 {
		go func() {
			lease, err := l.Acquire(ctx, name, WithWait(time.Minute))
			if err == nil {
				err = lease.Release(ctx)
			}
			results <- err
		}()
		// The first registers first, and is the one a release wakes.
		require.Eventually(t, func() bool { return attempts.Load() == int64(2*(i+1)) }, 5*time.Second, time.Millisecond)
	}
	var failed atomic.Bool
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" && failed.CompareAndSwap(false, true) {
			return errors.New("injected: the woken waiter's attempt fails")
		}
		return nil
	}, nil)
	start := time.Now()
	require.NoError(t, held.Release(ctx))
	for range 2 { // the second is woken when the first passes its wake-up on, the first by the second's release
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the wake-up was not passed on: nobody took the free lock")
		}
	}
	assert.True(t, failed.Load())
	assert.Less(t, time.Since(start), 10*time.Second)
}

// Two releases at once, of a semaphore's two permits, wake two waiters: one
// already woken, its wake-up not yet taken, is not chosen again.
func TestTwoReleasesWakeTwoWaiters(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	sem := l.Semaphore(uniqueName(t), 2)
	var held [2]*Lease
	for i := range held {
		lease, err := sem.Acquire(ctx, WithTTL(time.Minute))
		require.NoError(t, err)
		held[i] = lease
	}
	attempts := countAcquires(e)
	got := make(chan *Lease, 2)
	for range 2 {
		go func() {
			lease, err := sem.Acquire(ctx, WithWait(time.Minute), WithTTL(time.Minute))
			assert.NoError(t, err)
			got <- lease
		}()
	}
	// Each tries once and, subscribed, once more.
	require.Eventually(t, func() bool { return attempts.Load() >= 4 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	var wg sync.WaitGroup
	for _, h := range held {
		wg.Go(func() { assert.NoError(t, h.Release(ctx)) })
	}
	wg.Wait()
	for range 2 {
		select {
		case lease := <-got:
			require.NotNil(t, lease)
			defer func() { assert.NoError(t, lease.Release(ctx)) }()
		case <-time.After(5 * time.Second):
			t.Fatal("a free permit and a waiter left on its 20s backoff: a wake-up was lost")
		}
	}
}

// A waiter woken by a release that gives up before its attempt answers
// passes the wake-up on: the next waiter tries at once, not after its
// backoff (20s here).
func TestWakeUpPassedOnWhenTheWokenGivesUp(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	attempts := countAcquires(e)
	first, cancel := context.WithCancel(ctx)
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() {
		_, err := l.Acquire(first, name, WithWait(time.Minute))
		gaveUp <- err
	}()
	require.Eventually(t, func() bool { return attempts.Load() == 2 }, 5*time.Second, time.Millisecond)
	got := acquireInBackground(t, l, name, WithWait(time.Minute))
	require.Eventually(t, func() bool { return attempts.Load() == 4 }, 5*time.Second, time.Millisecond)
	// The first waiter's woken attempt is held back until its ctx ends.
	var once atomic.Bool
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" && once.CompareAndSwap(false, true) {
			cancel()
			time.Sleep(100 * time.Millisecond)
			return errors.New("injected: not sent")
		}
		return nil
	}, nil)
	require.NoError(t, held.Release(ctx))
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	r := requireAcquired(t, got, 5*time.Second, "the wake-up died with the waiter that gave up (backoff 20s)")
	require.NoError(t, r.lease.Release(ctx))
}
