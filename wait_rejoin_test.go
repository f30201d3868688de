package fencelock

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A waiter that registers on a channel its last waiter has just left, before
// the hub has run, is woken as subscribed: the hub's connection still is, so
// the hub sends nothing, and no other confirmation comes. Two orders, with a
// hub that does not run (so the order is the test's): the leave before the
// subscription's confirmation was read, and after.
func TestRejoinBeforeTheHubRunsIsConfirmed(t *testing.T) {
	const ch = "lock:{x}"
	setup := func(t *testing.T) (*notifier, *hub, *conn) {
		client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used: no hub runs
		t.Cleanup(func() { _ = client.Close() })
		n := newNotifier(client, slog.New(slog.DiscardHandler), systemClock{})
		t.Cleanup(func() { n.close(time.Now().Add(time.Minute)) })
		h := &hub{n: n, kick: make(chan struct{}, 1), want: map[string]struct{}{}, confirmed: map[string]struct{}{}}
		n.hubs[""] = h // attachLocked finds it, and starts no goroutine
		return n, h, newConn(true)
	}
	woken := func(w *waiter) bool {
		select {
		case <-w.wake:
			return true
		default:
			return false
		}
	}

	t.Run("confirmed, then left", func(t *testing.T) {
		n, h, c := setup(t)
		w := n.register(ch, nil, everyMessage{})
		c.sent[ch] = time.Now() // the hub's sync subscribed it
		require.True(t, h.handle(c, &redis.Subscription{Kind: "ssubscribe", Channel: ch, Count: 1}))
		require.True(t, woken(w), "woken by the confirmation")
		for i := range 20 {
			w.leave()
			w = n.register(ch, nil, everyMessage{})
			require.True(t, woken(w), "rejoin %d: the channel is still subscribed, and no confirmation will come", i)
		}
		w.leave()
	})

	t.Run("left, then confirmed", func(t *testing.T) {
		n, h, c := setup(t)
		w := n.register(ch, nil, everyMessage{})
		c.sent[ch] = time.Now()
		w.leave()
		require.True(t, h.handle(c, &redis.Subscription{Kind: "ssubscribe", Channel: ch, Count: 1}))
		w = n.register(ch, nil, everyMessage{})
		require.True(t, woken(w), "the connection is subscribed, and no confirmation will come")
		w.leave()
	})
}

// The same against a real server and a running hub: a waiter leaves and
// registers again at once, many times; each registration is woken as
// subscribed, not left to poll. checkPending, which would subscribe the
// channel again after reroute, is held off.
func TestRejoinLoopIsConfirmed(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	n := waitsOf(l)
	n.reroute = time.Hour // before any hub runs
	ch := "lock:{" + uniqueName(t) + "}"
	w := n.register(ch, nil, everyMessage{})
	require.NotNil(t, w)
	select {
	case <-w.wake:
	case <-time.After(5 * time.Second):
		t.Fatal("the first registration was not confirmed")
	}
	for i := range 50 {
		w.leave()
		w = n.register(ch, nil, everyMessage{})
		select {
		case <-w.wake:
		case <-time.After(2 * time.Second):
			w.leave()
			t.Fatalf("rejoin %d: not woken as subscribed within 2s", i)
		}
	}
	w.leave()
}
