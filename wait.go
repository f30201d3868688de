package fencelock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Push-based waiting, as documented in doc.go: the release script publishes
// on a channel named like the lock key (pub/sub channels and keys are separate
// namespaces), and waiting Acquire calls listen through a notifier.

// notifier fans release announcements out to the waiting Acquire calls of one
// Locker. It owns every goroutine it starts (hub openers, hub readers, idle
// closers) and close waits for all of them.
type notifier struct {
	client  redis.UniversalClient
	cluster bool          // one hub per channel instead of one per Locker (Cluster, Ring)
	linger  time.Duration // hubLinger; shortened by tests
	wg      sync.WaitGroup

	mu      sync.Mutex
	closed  bool                // guarded by mu; Locker.Close was called
	hubs    map[string]*hub     // guarded by mu; by hubKey
	opening map[string]*opening // guarded by mu; hubs being opened
	classic bool                // guarded by mu; the server has no sharded pub/sub
}

// hubLinger is how long a hub stays open after its last waiter left, so that a
// steady stream of waits does not reconnect each time.
const hubLinger = 30 * time.Second

// openTimeout bounds the opening of a hub: dial, handshake, subscription.
const openTimeout = 5 * time.Second

// errClosed is returned by register after Locker.Close.
var errClosed = errors.New("fencelock: locker closed")

func newNotifier(client redis.UniversalClient) *notifier {
	// A Cluster or a Ring routes a subscription by its channel: one hub
	// per channel, each on the node that serves it.
	var cluster bool
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		cluster = true
	}
	return &notifier{
		client: client, cluster: cluster, linger: hubLinger,
		hubs: make(map[string]*hub), opening: make(map[string]*opening),
	}
}

// opening is a hub being opened by its own goroutine.
type opening struct {
	done chan struct{} // closed when the attempt ended
	err  error         // written before done is closed
}

// A hub is one subscription connection and the goroutine that reads it.
type hub struct {
	ps      *redis.PubSub
	sharded bool
	key     string
	stop    chan struct{} // closed when the hub is shut down
	done    chan struct{} // closed by the reader goroutine on exit

	// subMu is held across a change of waiters' channels and the
	// SUBSCRIBE or UNSUBSCRIBE it calls for, so that the server sees them in
	// the order the changes were made. It is taken before notifier.mu.
	subMu sync.Mutex

	waiters map[string]map[*waiter]struct{} // guarded by notifier.mu; a set exists while its channel is subscribed
	count   int                             // guarded by notifier.mu; waiters in all sets
	idle    *time.Timer                     // guarded by notifier.mu; closes the hub after linger without waiters
	closed  bool                            // guarded by notifier.mu; stop is closed
}

// A waiter is one waiting Acquire call's registration.
type waiter struct {
	n       *notifier
	h       *hub
	channel string
	wake    chan struct{} // buffered: a pending wake-up
}

func (n *notifier) hubKey(channel string) string {
	if n.cluster {
		return channel
	}
	return ""
}

// register subscribes to channel for a waiting Acquire. The waiter is woken
// when the subscription is confirmed (or at once, if it already was) and on
// every release. register returns early with ctx's error; on any error the
// caller waits without wake-ups.
func (n *notifier) register(ctx context.Context, channel string) (*waiter, error) {
	key := n.hubKey(channel)
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return nil, errClosed
		}
		h := n.hubs[key]
		if h == nil {
			op := n.opening[key]
			if op == nil {
				op = &opening{done: make(chan struct{})}
				n.opening[key] = op
				n.wg.Add(1)
				go n.openHub(key, channel, n.classic, op)
			}
			n.mu.Unlock()
			select {
			case <-op.done:
				if op.err != nil {
					return nil, op.err
				}
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		n.mu.Unlock()

		h.subMu.Lock()
		n.mu.Lock()
		if h.closed { // closed meanwhile: look again
			n.mu.Unlock()
			h.subMu.Unlock()
			continue
		}
		n.stopIdleLocked(h)
		w := &waiter{n: n, h: h, channel: channel, wake: make(chan struct{}, 1)}
		set := h.waiters[channel]
		subscribed := set != nil
		if !subscribed {
			set = make(map[*waiter]struct{})
			h.waiters[channel] = set
		}
		set[w] = struct{}{}
		h.count++
		n.mu.Unlock()
		if subscribed {
			// The channel is subscribed, or its confirmation is on its way
			// and will wake w again: try now.
			h.subMu.Unlock()
			w.signal()
			return w, nil
		}
		err := h.subscribe(ctx, channel)
		h.subMu.Unlock()
		if err != nil {
			w.leave()
			return nil, err
		}
		return w, nil // the server's confirmation wakes w
	}
}

// openHub is the goroutine that opens the hub for key, subscribed to
// channel. Waiters registering meanwhile wait for op.
func (n *notifier) openHub(key, channel string, classic bool, op *opening) {
	defer n.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	h, err := n.open(ctx, key, channel, classic)

	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.opening, key)
	op.err = err
	if err == nil && n.closed {
		op.err = errClosed
		_ = h.ps.Close()
	}
	close(op.done)
	if op.err != nil {
		return
	}
	n.hubs[key] = h
	n.wg.Add(1)
	go n.read(h)
	n.startIdleLocked(h) // until the first waiter registers
}

// leave deregisters w. The last waiter on a channel unsubscribes it; a hub
// without waiters stays open for n.linger, then closes.
func (w *waiter) leave() {
	n, h := w.n, w.h
	h.subMu.Lock()
	defer h.subMu.Unlock()
	n.mu.Lock()
	set := h.waiters[w.channel]
	delete(set, w)
	h.count--
	lastOnChannel := len(set) == 0
	if lastOnChannel {
		delete(h.waiters, w.channel)
	}
	if h.count == 0 && !h.closed {
		n.startIdleLocked(h)
	}
	closed := h.closed
	n.mu.Unlock()
	if lastOnChannel && !closed {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = h.unsubscribe(ctx, w.channel)
		cancel()
	}
}

// startIdleLocked arms h's idle timer, which closes h unless a waiter
// registers first.
func (n *notifier) startIdleLocked(h *hub) {
	if h.idle != nil {
		return
	}
	n.wg.Add(1)
	h.idle = time.AfterFunc(n.linger, func() {
		defer n.wg.Done()
		n.mu.Lock()
		if h.count > 0 || h.closed {
			n.mu.Unlock()
			return
		}
		n.shutdownLocked(h)
		n.mu.Unlock()
		h.wait()
	})
}

// stopIdleLocked disarms h's idle timer, if it has not fired yet.
func (n *notifier) stopIdleLocked(h *hub) {
	if h.idle != nil && h.idle.Stop() {
		n.wg.Done()
	}
	h.idle = nil
}

// close shuts every hub down and waits for every goroutine of n; later waits
// poll.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	var hubs []*hub
	for _, h := range n.hubs {
		n.shutdownLocked(h)
		hubs = append(hubs, h)
	}
	n.mu.Unlock()
	for _, h := range hubs {
		h.wait()
	}
	n.wg.Wait()
}

// shutdownLocked marks h closed and tells its goroutine to stop; the caller
// then calls h.wait without holding n.mu.
func (n *notifier) shutdownLocked(h *hub) {
	h.closed = true
	close(h.stop)
	if n.hubs[h.key] == h {
		delete(n.hubs, h.key)
	}
	n.stopIdleLocked(h)
}

// wait closes h's connection and waits for its reader goroutine to exit.
func (h *hub) wait() {
	_ = h.ps.Close()
	<-h.done
}

// open opens a hub's connection, subscribed to channel, and waits for the
// server's confirmation. A server without sharded pub/sub answers SSUBSCRIBE
// with an error; open then falls back to SUBSCRIBE for good.
func (n *notifier) open(ctx context.Context, key, channel string, classic bool) (*hub, error) {
	h := &hub{
		key:     key,
		waiters: map[string]map[*waiter]struct{}{channel: {}},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if !classic {
		h.ps, h.sharded = n.client.SSubscribe(ctx, channel), true
		err := confirm(ctx, h.ps)
		if err == nil {
			return h, nil
		}
		_ = h.ps.Close()
		if !isUnknownCommand(err) {
			return nil, err
		}
		n.mu.Lock()
		n.classic = true
		n.mu.Unlock()
	}
	h.ps, h.sharded = n.client.Subscribe(ctx, channel), false
	if err := confirm(ctx, h.ps); err != nil {
		_ = h.ps.Close()
		return nil, err
	}
	return h, nil
}

// confirm reads the reply to the first subscription of ps, for no longer than
// ctx allows and at most confirmTimeout (go-redis does not bound a pub/sub
// read by the context alone).
func confirm(ctx context.Context, ps *redis.PubSub) error {
	timeout := confirmTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if timeout <= 0 {
		return context.DeadlineExceeded
	}
	for {
		msg, err := ps.ReceiveTimeout(ctx, timeout)
		if err != nil {
			return err
		}
		if _, ok := msg.(*redis.Subscription); ok {
			return nil
		}
	}
}

const confirmTimeout = 2 * time.Second

func isUnknownCommand(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "unknown command")
}

func (h *hub) subscribe(ctx context.Context, channel string) error {
	if h.sharded {
		return h.ps.SSubscribe(ctx, channel)
	}
	return h.ps.Subscribe(ctx, channel)
}

func (h *hub) unsubscribe(ctx context.Context, channel string) error {
	if h.sharded {
		return h.ps.SUnsubscribe(ctx, channel)
	}
	return h.ps.Unsubscribe(ctx, channel)
}

// read is a hub's goroutine: it delivers wake-ups until the hub is stopped.
func (n *notifier) read(h *hub) {
	defer n.wg.Done()
	defer close(h.done)
	pause := backoff{min: 10 * time.Millisecond, max: time.Second}
	for {
		msg, err := h.ps.Receive(context.Background())
		select {
		case <-h.stop:
			return
		default:
		}
		if err != nil {
			// The connection broke: go-redis reconnects and resubscribes on
			// the next Receive. Messages may have been lost meanwhile, so
			// every waiter tries again now.
			n.wakeAll(h)
			t := time.NewTimer(pause.next())
			select {
			case <-h.stop:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		pause = backoff{min: pause.min, max: pause.max}
		switch m := msg.(type) {
		case *redis.Message:
			n.wakeChannel(h, m.Channel)
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				// A new or renewed subscription: wake-ups sent before it
				// may have been missed.
				n.wakeChannel(h, m.Channel)
			}
		}
	}
}

func (n *notifier) wakeChannel(h *hub, channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for w := range h.waiters[channel] {
		w.signal()
	}
}

func (n *notifier) wakeAll(h *hub) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, set := range h.waiters {
		for w := range set {
			w.signal()
		}
	}
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
