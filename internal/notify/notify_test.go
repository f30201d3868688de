package notify_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/goredis"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/redistest"
)

// These tests run a Notifier on real redis-server processes, through the
// go-redis Network of internal/goredis.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ctx = context.Background()

// newNotifier returns a Notifier on client, closed (its goroutines ended)
// when the test ends, before client is.
func newNotifier(t *testing.T, client redis.UniversalClient, o notify.Options) *notify.Notifier {
	t.Helper()
	n := notify.New(goredis.NewNetwork(client), o)
	t.Cleanup(func() {
		n.Close(time.Now().Add(time.Minute))
		n.Wait()
	})
	return n
}

// channel returns a channel name unique to the test.
func channel(t *testing.T) string { return "lock:{" + t.Name() + "}" }

// requireWoken waits up to d for a wake-up of w.
func requireWoken(t *testing.T, w *notify.Waiter, d time.Duration, msg string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(d):
		t.Fatal(msg)
	}
}

// shardSubscribers returns how many connections of s subscribe channel with
// SSUBSCRIBE.
func shardSubscribers(t *testing.T, s *redistest.Server, channel string) int64 {
	t.Helper()
	v, err := s.Do("PUBSUB", "SHARDNUMSUB", channel)
	require.NoError(t, err)
	reply, _ := v.([]any)
	require.Len(t, reply, 2, "PUBSUB SHARDNUMSUB reply")
	n, _ := reply[1].(int64)
	return n
}

// heard is a Hearer that every message wakes, and that records the
// payloads it hears ("" for a confirmation).
type heard struct {
	linger bool
	mu     sync.Mutex
	got    []string // guarded by mu
}

func (h *heard) Hear(m notify.Message) notify.Hearing {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, m.Payload)
	return notify.WakeAll
}

func (h *heard) Lingers() bool { return h.linger }

// count returns how many times h heard payload.
func (h *heard) count(payload string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.got {
		if p == payload {
			n++
		}
	}
	return n
}

// A hub lingers after its last channel left: a wait within the linger
// reuses its connection; after it, the hub closes, and the next wait opens
// a new one.
func TestSubscriptionLingersThenCloses(t *testing.T) {
	srv := redistest.Start(t)
	n := newNotifier(t, srv.Client(nil), notify.Options{})
	n.SetLinger(300 * time.Millisecond)
	admin, ch := srv.Client(nil), channel(t)
	var hubs []any
	wait := func() {
		t.Helper()
		w := n.Register(ch, nil, notify.EveryMessage{})
		require.NotNil(t, w)
		requireWoken(t, w, 5*time.Second, "not confirmed")
		hubs = append(hubs, n.Hub(""))
		require.NoError(t, admin.SPublish(ctx, ch, "released").Err())
		requireWoken(t, w, 5*time.Second, "not woken by the message")
		w.Leave()
	}
	wait()
	wait()
	assert.Same(t, hubs[0], hubs[1], "a wait within the linger reuses the connection")
	require.Eventually(t, func() bool { return n.Hubs() == 0 }, 5*time.Second, 10*time.Millisecond, "closed after the linger")
	wait()
	assert.NotSame(t, hubs[0], hubs[2], "reopened by the next wait")
}

// A channel stays subscribed for ChannelLinger after its last waiter left
// if that one lingers, then its hub unsubscribes it and keeps no state for
// it; one whose last waiter does not linger is unsubscribed at once. The
// hub itself closes after its own linger.
func TestChannelLingersThenEnds(t *testing.T) {
	srv := redistest.Start(t)
	n := newNotifier(t, srv.Client(nil), notify.Options{})
	n.SetLinger(300 * time.Millisecond)
	ch := channel(t)
	wait := func(h notify.Hearer) time.Time {
		t.Helper()
		w := n.Register(ch, nil, h)
		require.NotNil(t, w)
		requireWoken(t, w, 5*time.Second, "not confirmed")
		require.Equal(t, int64(1), shardSubscribers(t, srv, ch))
		w.Leave()
		return time.Now()
	}

	left := wait(&heard{linger: true})
	assert.True(t, n.Subscribed(ch), "still subscribed just after the last waiter left")
	assert.Equal(t, int64(1), shardSubscribers(t, srv, ch))
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, ch) == 0 }, 5*time.Second, 5*time.Millisecond,
		"unsubscribed after the channel's linger")
	assert.GreaterOrEqual(t, time.Since(left), notify.ChannelLinger-100*time.Millisecond, "not before the linger")
	assert.False(t, n.Subscribed(ch))
	assert.Zero(t, n.Channels(), "no state kept for the channel")

	left = wait(notify.EveryMessage{})
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, ch) == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Less(t, time.Since(left), notify.ChannelLinger/2, "a channel whose last waiter does not linger")
	assert.Zero(t, n.Channels())
	require.Eventually(t, func() bool { return n.Hubs() == 0 }, 5*time.Second, 10*time.Millisecond, "the hub closes after its linger")
}

// A hub whose connection breaks after it lasted reopens it at once, however
// often it broke before: its reopen backoff starts over. One that breaks as
// soon as it is opened waits ever longer.
func TestHubReopensAtOnceAfterALastingConnection(t *testing.T) {
	srv := redistest.Start(t)
	n := newNotifier(t, srv.Client(nil), notify.Options{})
	admin := srv.Client(nil)
	var h heard
	w := n.Register(channel(t), nil, &h)
	require.NotNil(t, w)
	t.Cleanup(w.Leave)
	require.Eventually(t, func() bool { return h.count("") == 1 }, 5*time.Second, time.Millisecond)
	// reopen breaks the hub's connection and returns when the hub's new
	// one is confirmed (go-redis's own reconnection, which the hub closes
	// at once, confirms nothing to the hub).
	reopen := func() time.Duration {
		t.Helper()
		before, start := h.count(""), time.Now()
		require.NoError(t, admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
		require.Eventually(t, func() bool { return h.count("") > before }, 10*time.Second, time.Millisecond)
		return time.Since(start)
	}
	for range 6 { // broken at once: the backoff grows to 160-320ms
		reopen()
	}
	time.Sleep(1200 * time.Millisecond) // longer than the backoff's longest step, 1s
	d := reopen()
	t.Logf("reopened in %v", d)
	assert.Less(t, d, 250*time.Millisecond, "without the reset, its next step: 320-640ms")
}

// A waiter leaves and registers again at once, many times, against a
// running hub: each registration is woken as subscribed, not left to poll
// (internal TestRejoinBeforeTheHubRunsIsConfirmed orders the same by hand).
// The rerouting of unconfirmed channels, which would subscribe the channel
// again, is held off.
func TestRejoinLoopIsConfirmed(t *testing.T) {
	srv := redistest.Start(t)
	n := newNotifier(t, srv.Client(nil), notify.Options{Reroute: time.Hour})
	ch := channel(t)
	w := n.Register(ch, nil, notify.EveryMessage{})
	require.NotNil(t, w)
	requireWoken(t, w, 5*time.Second, "the first registration was not confirmed")
	for i := range 50 {
		w.Leave()
		w = n.Register(ch, nil, notify.EveryMessage{})
		select {
		case <-w.C():
		case <-time.After(2 * time.Second):
			w.Leave()
			t.Fatalf("rejoin %d: not woken as subscribed within 2s", i)
		}
	}
	w.Leave()
}

// countingClock is the system's clock, except that its timers fire at once
// when instant is set; it counts the timers asked for.
type countingClock struct {
	instant bool
	timers  atomic.Int64
}

func (c *countingClock) Now() time.Time { return time.Now() }

func (c *countingClock) NewTimer(d time.Duration) *time.Timer {
	c.timers.Add(1)
	if c.instant {
		d = 0
	}
	return time.NewTimer(d)
}

// A Clock whose timers fire at once (early: not what a Clock may do) only
// hastens the hub's steps. Subscribed and confirmed, it has nothing due and
// asks for no timer; its linger then ends at once. A hub that kept a timer
// armed for "nothing due", or waited for Now to reach a time, would loop on
// the timer.
func TestHubDoesNotSpinOnInstantTimers(t *testing.T) {
	srv := redistest.Start(t)
	clock := &countingClock{instant: true}
	n := newNotifier(t, srv.Client(nil), notify.Options{Clock: clock}) // Close's wait ends at once: newNotifier waits
	ch := channel(t)
	w := n.Register(ch, nil, notify.EveryMessage{})
	require.Eventually(t, func() bool { return n.Subscribed(ch) }, 5*time.Second, time.Millisecond)
	before := clock.timers.Load()
	time.Sleep(20 * time.Millisecond) // a spinning hub asks for a timer at every turn
	assert.Equal(t, before, clock.timers.Load(), "no timer while nothing is due")
	w.Leave()
	require.Eventually(t, func() bool { return n.Hubs() == 0 }, 5*time.Second, time.Millisecond,
		"the linger ends when its timer fires")
	assert.Less(t, clock.timers.Load()-before, int64(10), "a few timers for the linger")
}

// stillClock is a Clock whose Now never moves; its timers are real.
type stillClock struct{ now time.Time }

func (c stillClock) Now() time.Time                     { return c.now }
func (stillClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

// A Clock's Now need only be monotonic: one that never moves still ends
// the hub's linger, when the linger's timer fires.
func TestHubLingerEndsOnAClockThatStandsStill(t *testing.T) {
	srv := redistest.Start(t)
	n := newNotifier(t, srv.Client(nil), notify.Options{Clock: stillClock{time.Now()}})
	n.SetLinger(20 * time.Millisecond)
	ch := channel(t)
	w := n.Register(ch, nil, notify.EveryMessage{})
	requireWoken(t, w, 5*time.Second, "not confirmed")
	require.NoError(t, srv.Client(nil).SPublish(ctx, ch, "released").Err())
	requireWoken(t, w, 5*time.Second, "not woken by the message")
	w.Leave()
	require.Eventually(t, func() bool { return n.Hubs() == 0 }, 5*time.Second, time.Millisecond,
		"closed after its linger although Now stands still")
}

// A server without sharded pub/sub (miniredis, Redis 6.2) refuses
// SSUBSCRIBE as an unknown command: the Notifier subscribes with SUBSCRIBE
// instead, and hears PUBLISH.
func TestClassicPubSubFallback(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	n := newNotifier(t, client, notify.Options{})
	ch := channel(t)
	var h heard
	w := n.Register(ch, nil, &h)
	requireWoken(t, w, 5*time.Second, "not confirmed through SUBSCRIBE")
	require.Eventually(t, func() bool { return len(m.PubSubChannels("*")) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, client.Publish(ctx, ch, "released").Err())
	require.Eventually(t, func() bool { return h.count("released") == 1 }, 5*time.Second, time.Millisecond,
		"no message through PUBLISH/SUBSCRIBE")
	w.Leave()
}

// A Cluster master crashes and its replica takes over: a waiter on a
// channel of its slots is subscribed again on the new master, a message
// published there wakes it, and the dead master's hub ends. Before, that
// hub redialed the dead master forever and its channels were never routed
// again.
func TestClusterCrashFailoverResubscribesWaiters(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 1)
	client := c.Client(nil)
	n := newNotifier(t, client, notify.Options{})
	ch := channel(t)
	v, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", ch)
	require.NoError(t, err)
	slot := int(v.(int64))
	from := c.MasterOf(slot)
	to := c.Replicas[slices.Index(c.Masters, from)][0]

	var h heard
	w := n.Register(ch, nil, &h)
	require.NotNil(t, w)
	t.Cleanup(w.Leave)
	require.Eventually(t, func() bool { return shardSubscribers(t, from, ch) == 1 }, 5*time.Second, time.Millisecond,
		"the waiter subscribes on the master")

	from.Kill()
	_, err = to.Do("CLUSTER", "FAILOVER", "TAKEOVER")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.MasterOf(slot) == to }, 10*time.Second, 10*time.Millisecond,
		"the replica serves the slot")
	require.Eventually(t, func() bool {
		client.ReloadState(ctx)
		node, err := client.MasterForKey(ctx, ch)
		return err == nil && node.Options().Addr == to.Addr
	}, 10*time.Second, 10*time.Millisecond, "the client learns the new master")

	assert.Eventually(t, func() bool { return shardSubscribers(t, to, ch) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the waiter subscribes on the new master")
	assert.Eventually(t, func() bool { return n.Hub(from.Addr) == nil }, 10*time.Second, 10*time.Millisecond,
		"the dead master's hub ends, its channel gone")
	_, err = to.Do("SPUBLISH", ch, "released")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.count("released") == 1 }, 5*time.Second, time.Millisecond,
		"the message on the new master did not wake the waiter")
}
