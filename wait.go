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
// Locker.
type notifier struct {
	client  redis.UniversalClient
	cluster bool          // one hub per channel instead of one per Locker
	linger  time.Duration // hubLinger; shortened by tests

	mu      sync.Mutex
	closed  bool                     // guarded by mu; Locker.Close was called
	hubs    map[string]*hub          // guarded by mu; by hubKey
	opening map[string]chan struct{} // guarded by mu; closed when a hub's opening ends
	classic bool                     // guarded by mu; the server has no sharded pub/sub
}

func newNotifier(client redis.UniversalClient) *notifier {
	_, cluster := client.(*redis.ClusterClient)
	return &notifier{client: client, cluster: cluster, linger: hubLinger, hubs: make(map[string]*hub), opening: make(map[string]chan struct{})}
}

// A hub is one subscription connection and the goroutine that reads it. The
// goroutine is started by the first waiter and stopped, and waited for, by the
// last one to leave.
type hub struct {
	ps      *redis.PubSub
	sharded bool
	key     string
	waiters map[string]map[*waiter]struct{} // guarded by notifier.mu; by channel
	idle    *time.Timer                     // guarded by notifier.mu; closes the hub after hubLinger without waiters
	closed  bool                            // guarded by notifier.mu; stop is closed
	stop    chan struct{}                   // closed when the hub is shut down
	done    chan struct{}                   // closed by the goroutine on exit
}

// hubLinger is how long a hub stays open after its last waiter left, so that a
// steady stream of waits does not reconnect each time.
const hubLinger = 30 * time.Second

// errClosed is returned by register after Locker.Close.
var errClosed = errors.New("fencelock: locker closed")

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

// register subscribes to channel for a waiting Acquire and returns once the
// server has confirmed the subscription (for a channel new to its hub, the
// confirmation arrives as a wake-up). On error the caller waits without
// wake-ups.
func (n *notifier) register(ctx context.Context, channel string) (*waiter, error) {
	key := n.hubKey(channel)
	n.mu.Lock()
	for n.hubs[key] == nil {
		if n.closed {
			n.mu.Unlock()
			return nil, errClosed
		}
		if opening, ok := n.opening[key]; ok {
			// Another waiter is opening the hub: wait for it, then look
			// again (it may have failed).
			n.mu.Unlock()
			select {
			case <-opening:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			n.mu.Lock()
			continue
		}
		opening := make(chan struct{})
		n.opening[key] = opening
		classic := n.classic
		n.mu.Unlock()
		h, err := n.open(ctx, channel, classic)
		n.mu.Lock()
		delete(n.opening, key)
		close(opening)
		if err != nil {
			n.mu.Unlock()
			return nil, err
		}
		if n.closed {
			n.mu.Unlock()
			_ = h.ps.Close()
			return nil, errClosed
		}
		n.hubs[key] = h
		go n.read(h)
	}
	h := n.hubs[key]
	if h.idle != nil { // lingering: keep it
		h.idle.Stop()
		h.idle = nil
	}
	w := &waiter{n: n, h: h, channel: channel, wake: make(chan struct{}, 1)}
	set := h.waiters[channel]
	first := set == nil
	if first {
		set = make(map[*waiter]struct{})
		h.waiters[channel] = set
	}
	set[w] = struct{}{}
	n.mu.Unlock()
	if !first {
		// The channel is subscribed, or its confirmation is on its way and
		// will wake w again: try now.
		w.signal()
		return w, nil
	}
	if err := h.subscribe(ctx, channel); err != nil {
		w.leave()
		return nil, err
	}
	return w, nil // the server's confirmation wakes w
}

// open opens a hub's connection, subscribed to channel, and waits for the
// server's confirmation. A server without sharded pub/sub answers SSUBSCRIBE
// with an error; open then falls back to SUBSCRIBE for good.
func (n *notifier) open(ctx context.Context, channel string, classic bool) (*hub, error) {
	h := &hub{
		key:     n.hubKey(channel),
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

// leave deregisters w. The last waiter on a channel unsubscribes it; the last
// waiter of a hub leaves it open for hubLinger, after which it is closed.
func (w *waiter) leave() {
	n, h := w.n, w.h
	n.mu.Lock()
	set := h.waiters[w.channel]
	delete(set, w)
	lastOnChannel := len(set) == 0
	if lastOnChannel {
		delete(h.waiters, w.channel)
	}
	if len(h.waiters) == 0 && !h.closed && h.idle == nil {
		h.idle = time.AfterFunc(n.linger, func() { n.closeIfIdle(h) })
	}
	closed := h.closed
	n.mu.Unlock()
	if lastOnChannel && !closed {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = h.unsubscribe(ctx, w.channel)
		cancel()
	}
}

// closeIfIdle closes h if it still has no waiters.
func (n *notifier) closeIfIdle(h *hub) {
	n.mu.Lock()
	if len(h.waiters) > 0 || h.closed {
		n.mu.Unlock()
		return
	}
	n.shutdownLocked(h)
	n.mu.Unlock()
	h.wait()
}

// close shuts every hub down and waits for their goroutines; later waits
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
}

// shutdownLocked marks h closed and tells its goroutine to stop; the caller
// then calls h.wait without holding n.mu.
func (n *notifier) shutdownLocked(h *hub) {
	h.closed = true
	close(h.stop)
	if n.hubs[h.key] == h {
		delete(n.hubs, h.key)
	}
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
}

// wait closes h's connection and waits for its goroutine to exit.
func (h *hub) wait() {
	_ = h.ps.Close()
	<-h.done
}

// read is a hub's goroutine: it delivers wake-ups until the hub is stopped.
func (n *notifier) read(h *hub) {
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
