// Package notify fans the messages published on Redis channels out to the
// calls that wait for them, through one subscription connection per node (a
// hub); registering and leaving never wait for Redis, and a payload means
// what the waiters' Hearers make of it. GUARANTEES.md ("Waiting") tells how.
package notify

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// HubLinger is how long a hub stays open after its last channel left, so
// that a steady stream of waits does not reconnect each time.
const HubLinger = 30 * time.Second

// ChannelLinger is how long a channel stays subscribed after its last waiter,
// whose Hearer lingers, left: a wait soon after finds it confirmed at once.
const ChannelLinger = time.Second

const routeTimeout = 5 * time.Second // bounds the lookup of a channel's node

// Clock is a source of local time: Now never goes back, and a timer from
// NewTimer(d) does not fire before d has passed.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) *time.Timer
}

type systemClock struct{}

func (systemClock) Now() time.Time                       { return time.Now() }
func (systemClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

// Options configures a Notifier; a zero field means its default.
type Options struct {
	Logger *slog.Logger // gets a failed or refused subscription at Debug; default: discard
	Clock  Clock        // every time and timer of the Notifier; default: the system's
	// Reroute is how long a subscription may stay unconfirmed, or its node
	// unreachable, before its channel is routed again. Default 2s.
	Reroute time.Duration
}

// A Notifier fans its Network's messages out to the waiters registered on
// them; Close waits for every goroutine it starts (hubs, readers, lookups).
type Notifier struct {
	net     Network
	topo    Topology
	log     *slog.Logger
	clock   Clock
	linger  atomic.Int64 // a time.Duration, HubLinger unless SetLinger changed it
	keep    atomic.Int64 // a time.Duration, ChannelLinger unless SetChannelLinger changed it
	reroute time.Duration
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // Add only under mu while !closed

	mu       sync.Mutex
	closed   bool                  // guarded by mu; Close was called
	classic  bool                  // guarded by mu; the server has no sharded pub/sub
	channels map[string]*chanState // guarded by mu; channels with waiters
	hubs     map[string]*hub       // guarded by mu; by node address, "" on Single
	seq      uint64                // guarded by mu; registrations so far
}

// chanState is one channel's waiters and the hub that subscribes to it.
type chanState struct {
	waiters map[*Waiter]struct{}
	hub     *hub // nil while the channel is being routed or could not be
	routing bool
	idle    time.Time // when its last waiter left; zero while it has waiters
}

// New returns a Notifier on net; it starts nothing until a registration.
func New(net Network, o Options) *Notifier {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
	if o.Reroute == 0 {
		o.Reroute = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Notifier{net: net, topo: net.Topology(), log: o.Logger, clock: o.Clock, reroute: o.Reroute,
		ctx: ctx, cancel: cancel, channels: make(map[string]*chanState), hubs: make(map[string]*hub)}
	n.linger.Store(int64(HubLinger))
	n.keep.Store(int64(ChannelLinger))
	return n
}

// SetLinger changes how long a hub stays open after its last channel left,
// from the hubs' next steps on (tests shorten it).
func (n *Notifier) SetLinger(d time.Duration) { n.linger.Store(int64(d)) }

// SetChannelLinger changes how long a channel stays subscribed after its
// last waiter left (tests lengthen it).
func (n *Notifier) SetChannelLinger(d time.Duration) { n.keep.Store(int64(d)) }

// Register adds a waiter on channel, woken on wake (buffered; made if nil)
// as h decides, and returns at once (nil after Close).
func (n *Notifier) Register(channel string, wake chan struct{}, h Hearer) *Waiter {
	if wake == nil {
		wake = make(chan struct{}, 1)
	}
	w := &Waiter{n: n, channel: channel, wake: wake, h: h}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.seq++
	w.seq = n.seq
	cs := n.channels[channel]
	if cs == nil {
		cs = &chanState{waiters: make(map[*Waiter]struct{})}
		n.channels[channel] = cs
	}
	cs.waiters[w] = struct{}{}
	cs.idle = time.Time{}
	switch {
	case cs.hub != nil:
		if _, ok := cs.hub.confirmed[channel]; ok && h.Hear(Message{}) != Ignore {
			poke(w.wake) // subscribed: try now, a message may have come since the caller last asked
		}
	case !cs.routing:
		n.routeLocked(channel, cs, "")
	}
	return w
}

// Hubs returns how many hubs n has: connections open, opening or lingering.
func (n *Notifier) Hubs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.hubs)
}

// Subscribed reports whether n's subscription to channel is confirmed: a
// waiter registered now hears every message published on it from now on.
func (n *Notifier) Subscribed(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.channels[channel]
	if cs == nil || cs.hub == nil {
		return false
	}
	_, ok := cs.hub.confirmed[channel]
	return ok
}

// Close shuts every hub down, wakes the waiters, and waits for n's goroutines
// until by at most (one in a call to a hung server ends with that call).
func (n *Notifier) Close(by time.Time) {
	n.mu.Lock()
	n.closed = true
	for _, h := range n.hubs {
		h.closed = true
		poke(h.kick)
	}
	n.signalLocked(nil)
	n.mu.Unlock()
	n.cancel()
	done := make(chan struct{})
	go func() { // ends with the last of n's goroutines (no Add after closed)
		n.wg.Wait()
		close(done)
	}()
	sleep(n.clock, by.Sub(n.clock.Now()), done)
}

// sleep waits for d on clock, or until done is closed.
func sleep(clock Clock, d time.Duration, done <-chan struct{}) {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// routeLocked assigns channel to the hub of the node that serves it: at once
// on Single, after a lookup on a goroutine of its own on Cluster and Ring.
func (n *Notifier) routeLocked(channel string, cs *chanState, moved string) {
	if n.topo == Single {
		n.attachLocked(channel, cs, "")
		return
	}
	cs.routing = true
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(n.ctx, routeTimeout)
		defer cancel()
		node, err := n.route(ctx, channel, moved)
		n.mu.Lock()
		defer n.mu.Unlock()
		cs.routing = false
		if n.closed || n.channels[channel] != cs {
			return // closed, or every waiter left meanwhile
		}
		if err != nil {
			// The waiters poll; the next registration tries again.
			n.log.LogAttrs(ctx, slog.LevelDebug, "fencelock: no node found for a wake-up channel",
				slog.String("channel", channel), slog.Any("error", err))
			return
		}
		n.attachLocked(channel, cs, node)
	}()
}

// route returns the node that serves channel, waiting briefly for the Network
// to learn a new one while it says moved (the node that lost the channel).
func (n *Notifier) route(ctx context.Context, channel, moved string) (string, error) {
	node, err := n.net.Route(ctx, channel)
	for i := 0; moved != "" && err == nil && node == moved && i < 50; i++ {
		n.net.Reload(ctx)
		sleep(n.clock, 20*time.Millisecond, ctx.Done())
		node, err = n.net.Route(ctx, channel)
	}
	return node, err
}

// attachLocked subscribes channel on the hub for node, opening it if needed.
func (n *Notifier) attachLocked(channel string, cs *chanState, node string) {
	h := n.hubs[node]
	if h == nil {
		h = newHub(n, node)
		n.hubs[node] = h
		n.wg.Add(1)
		go h.run()
	}
	cs.hub = h
	h.want[channel] = struct{}{}
	poke(h.kick)
	if _, ok := h.confirmed[channel]; ok { // still subscribed: its last waiter left just now
		for w := range cs.waiters {
			if w.h.Hear(Message{}) != Ignore {
				poke(w.wake)
			}
		}
	}
}

// rerouteLocked detaches channel from its hub and routes it again, away
// from moved if not "" (see route); on Single it does nothing.
func (n *Notifier) rerouteLocked(channel, moved string) {
	cs := n.channels[channel]
	if n.topo == Single || cs == nil || cs.routing {
		return
	}
	if cs.hub != nil {
		delete(cs.hub.want, channel)
		delete(cs.hub.confirmed, channel)
		poke(cs.hub.kick)
		cs.hub = nil
	}
	if len(cs.waiters) == 0 { // lingering: nobody needs it elsewhere
		delete(n.channels, channel)
		return
	}
	n.net.Reload(n.ctx)
	n.routeLocked(channel, cs, moved)
}

// wake gives the message payload to the waiters on channel.
func (n *Notifier) wake(channel, payload string) {
	m := parseMessage(payload)
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.channels[channel]; cs != nil {
		cs.deliverLocked(m, false)
	}
}

// signalLocked wakes every waiter on the channels of h, of every hub if nil.
func (n *Notifier) signalLocked(h *hub) {
	for _, cs := range n.channels {
		if h == nil || cs.hub == h {
			for w := range cs.waiters {
				poke(w.wake)
			}
		}
	}
}

// poke makes a send on ch, buffered, unless one is pending.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// earliest returns the earlier of a and b, the zero time meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}
