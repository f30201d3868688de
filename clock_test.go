package fencelock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/notify"
)

// These tests give the Locker a Clock of their own, and check that the
// wake-up connections (hubs) and the Redlock fan-out keep their time on it.
// testing/synctest does not fit here: a hub's reader waits on a network
// read, which a bubble does not count as blocked, so its fake time would
// not move while a hub is open; and in a bubble the time package and the
// Clock tell the same time, so it could not tell one from the other.

// stepClock is a Clock that moves only when the test calls advance. Its
// timers are real ones set far off, made to fire when advance reaches
// their time; it records the durations it was asked for. Once let go
// (before the Locker's Close, which waits on timers), its new timers are
// real ones.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time       // guarded by mu
	timers []stepTimer     // guarded by mu; not fired yet
	asked  []time.Duration // guarded by mu
	free   bool            // guarded by mu; let go
}

type stepTimer struct {
	t  *time.Timer
	at time.Time
}

func newStepClock() *stepClock { return &stepClock{now: time.Unix(1_000_000, 0)} }

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) NewTimer(d time.Duration) *time.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, d)
	if d <= 0 || c.free {
		return time.NewTimer(max(d, 0))
	}
	t := time.NewTimer(24 * time.Hour)
	c.timers = append(c.timers, stepTimer{t: t, at: c.now.Add(d)})
	return t
}

// advance moves the clock on by d and fires the timers it reaches (a
// timer the library stopped fires unread).
func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.timers = slices.DeleteFunc(c.timers, func(st stepTimer) bool {
		if st.at.After(c.now) {
			return false
		}
		st.t.Reset(0)
		return true
	})
}

func (c *stepClock) letGo() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.free = true
}

func (c *stepClock) wasAsked(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.asked, d)
}

func TestHubLingersOnTheClock(t *testing.T) {
	e := newEnv(t, nil)
	clock := newStepClock()
	l := e.locker(t, &Options{Clock: clock})
	t.Cleanup(clock.letGo)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	got := waitInBackground(l, name) // its pauses never end on clock: woken by the release
	require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond, "the waiter subscribes")
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 5*time.Second, "not woken by the release")

	// The waiter has left: the hub lingers, for notify.HubLinger on the clock.
	require.Eventually(t, func() bool { return clock.wasAsked(notify.HubLinger) }, 5*time.Second, time.Millisecond,
		"the hub asks the Locker's clock for its linger")
	assert.Equal(t, 1, openHubs(l), "lingering")
	clock.advance(notify.HubLinger)
	require.Eventually(t, func() bool { return openHubs(l) == 0 }, 5*time.Second, time.Millisecond,
		"closed once the clock has passed its linger")
}

func TestRedlockFanOutTimesOutOnTheClock(t *testing.T) {
	// Two nodes of three hang on Inspect, whatever the context: the call
	// ends when the fan-out's timeout (ReleaseTimeout) has passed on the
	// Locker's clock, and only then.
	e := newRedlockEnv(t, 3, nil)
	clock := newStepClock()
	const timeout = 7 * time.Second // on clock, never in real time
	l := e.locker(t, &Options{Clock: clock, ReleaseTimeout: timeout})
	t.Cleanup(clock.letGo)
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)

	hang := make(chan struct{})
	var once sync.Once
	unhang := func() {
		once.Do(func() { close(hang) })
		for _, h := range e.hooks {
			h.set(nil, nil)
		}
	}
	t.Cleanup(unhang) // before the Locker's Close: the hung calls end first
	for _, h := range e.hooks[1:] {
		h.set(func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "inspect" {
				<-hang
			}
			return nil
		}, nil)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.Inspect(ctx, name)
		done <- err
	}()
	require.Eventually(t, func() bool { return clock.wasAsked(timeout) }, 5*time.Second, time.Millisecond,
		"the fan-out asks the Locker's clock for its timeout")
	select {
	case err := <-done:
		t.Fatalf("Inspect returned before its timeout on the clock: %v", err)
	default:
	}
	clock.advance(timeout)
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Inspect did not return once the clock had passed its timeout")
	}
	require.ErrorIs(t, err, ErrUnavailable)
	// Node 0's answer may come after the clock was moved on.
	assert.Regexp(t, "[01] of 3 nodes answered, 2 needed", err.Error())
	unhang()
	require.NoError(t, lease.Release(ctx))
}
