package notify

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleNet is a Network no test here reaches: its hubs never run.
type idleNet struct{}

func (idleNet) Topology() Topology                            { return Single }
func (idleNet) Route(context.Context, string) (string, error) { return "", nil }
func (idleNet) Reload(context.Context)                        {}
func (idleNet) Open(string, bool) Conn                        { return nil }

// idleHub returns a Notifier on idleNet whose hub for "" does not run (so
// the order of events is the test's), and a connection of that hub.
func idleHub(t *testing.T) (*Notifier, *hub) {
	t.Helper()
	n := New(idleNet{}, Options{})
	t.Cleanup(func() { n.Close(time.Now().Add(time.Minute)) })
	h := newHub(n, "")
	h.c = newConn(nil, true)
	n.hubs[""] = h // attachLocked finds it, and starts no goroutine
	return n, h
}

func woken(w *Waiter) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

// The confirmation of our own unsubscription, when it arrives after the
// channel was subscribed again on the same connection (a wait came just as
// the channel's linger ended), is not taken for the server ending the new
// subscription (a slot move): the channel stays subscribed and confirmed.
func TestOwnUnsubscriptionAfterResubscribing(t *testing.T) {
	n, h := idleHub(t)
	c := h.c
	const ch = "lock:{x}"
	n.channels[ch] = &chanState{waiters: map[*Waiter]struct{}{}, hub: h}
	h.want[ch] = struct{}{}

	// sync unsubscribed it, then subscribed it again; the replies follow.
	c.unsent[ch]++
	c.sent[ch] = time.Now()
	require.True(t, h.handle(Event{Kind: Unsubscribed, Channel: ch}))
	require.True(t, h.handle(Event{Kind: Subscribed, Channel: ch}))

	assert.Contains(t, c.sent, ch, "still subscribed")
	assert.Empty(t, c.unsent)
	assert.Contains(t, h.confirmed, ch, "confirmed by the new subscription")
	assert.True(t, n.Subscribed(ch))

	// A later unsubscription that is not ours is the server's.
	require.True(t, h.handle(Event{Kind: Unsubscribed, Channel: ch}))
	assert.NotContains(t, c.sent, ch, "ended by the server")
	assert.False(t, n.Subscribed(ch))
}

// A waiter that registers on a channel its last waiter has just left, before
// the hub has run, is woken as subscribed: the hub's connection still is, so
// the hub sends nothing, and no other confirmation comes. Two orders: the
// leave before the subscription's confirmation was read, and after.
func TestRejoinBeforeTheHubRunsIsConfirmed(t *testing.T) {
	const ch = "lock:{x}"
	t.Run("confirmed, then left", func(t *testing.T) {
		n, h := idleHub(t)
		w := n.Register(ch, nil, EveryMessage{})
		h.c.sent[ch] = time.Now() // the hub's sync subscribed it
		require.True(t, h.handle(Event{Kind: Subscribed, Channel: ch}))
		require.True(t, woken(w), "woken by the confirmation")
		for i := range 20 {
			w.Leave()
			w = n.Register(ch, nil, EveryMessage{})
			require.True(t, woken(w), "rejoin %d: the channel is still subscribed, and no confirmation will come", i)
		}
		w.Leave()
	})

	t.Run("left, then confirmed", func(t *testing.T) {
		n, h := idleHub(t)
		w := n.Register(ch, nil, EveryMessage{})
		h.c.sent[ch] = time.Now()
		w.Leave()
		require.True(t, h.handle(Event{Kind: Subscribed, Channel: ch}))
		w = n.Register(ch, nil, EveryMessage{})
		require.True(t, woken(w), "the connection is subscribed, and no confirmation will come")
		w.Leave()
	})
}

// flakyNet is a Single Network whose first failures connections fail to
// dial; the others confirm every subscription. It records when each
// connection was tried.
type flakyNet struct {
	failures int
	mu       sync.Mutex
	tries    []time.Time // guarded by mu
}

func (*flakyNet) Topology() Topology                            { return Single }
func (*flakyNet) Route(context.Context, string) (string, error) { return "", nil }
func (*flakyNet) Reload(context.Context)                        {}
func (f *flakyNet) Open(string, bool) Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries = append(f.tries, time.Now())
	return &scriptedConn{fail: len(f.tries) <= f.failures, events: make(chan Event, 16), closed: make(chan struct{})}
}

func (f *flakyNet) opened() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tries)
}

type scriptedConn struct {
	fail   bool
	events chan Event
	once   sync.Once
	closed chan struct{}
}

func (c *scriptedConn) Subscribe(_ context.Context, ch string) error {
	if c.fail {
		return errors.New("dial tcp: connection refused")
	}
	c.events <- Event{Kind: Subscribed, Channel: ch}
	return nil
}

func (c *scriptedConn) Unsubscribe(_ context.Context, ch string) error {
	c.events <- Event{Kind: Unsubscribed, Channel: ch}
	return nil
}

func (c *scriptedConn) Receive(context.Context) Event {
	select {
	case e := <-c.events:
		return e
	case <-c.closed:
		return Event{Kind: Broken, Err: errors.New("closed")}
	}
}

func (c *scriptedConn) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

// A hub whose node cannot be reached tries again after the reopen backoff
// (10ms doubling to 1s, each pause jittered to half or more), and its
// waiter is woken by the confirmation once a connection is made.
func TestHubReopensAfterTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := &flakyNet{failures: 8}
		n := New(net, Options{})
		start := time.Now()
		w := n.Register("lock:{x}", nil, EveryMessage{})
		<-w.C()
		assert.True(t, n.Subscribed("lock:{x}"))

		tries := net.opened()
		require.Len(t, tries, 9, "eight failed, the ninth confirmed")
		assert.Equal(t, start, tries[0], "the first at once")
		ceil := 10 * time.Millisecond
		for i := 1; i < len(tries); i++ {
			pause := tries[i].Sub(tries[i-1])
			assert.GreaterOrEqual(t, pause, ceil/2, "pause %d", i)
			assert.LessOrEqual(t, pause, ceil, "pause %d", i)
			ceil = min(2*ceil, time.Second)
		}
		w.Leave()
		n.Close(time.Now().Add(time.Minute))
		n.Wait()
	})
}
