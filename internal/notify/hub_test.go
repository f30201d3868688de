package notify

import (
	"context"
	"testing"
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
