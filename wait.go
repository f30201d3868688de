package fencelock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
	"github.com/fencelock/fencelock/internal/tasks"
	"github.com/redis/go-redis/v9"
)

// Push-based waiting ("Waiting" in GUARANTEES.md): a release publishes on a
// channel named like the lock key, and waiting Acquire calls hear it through
// their Locker's notifier. Registering and leaving only change maps under
// notifier.mu and kick a hub (one connection, owned by its goroutine run):
// no registration and no Acquire's return waits for a subscription's change.

// notifier fans release announcements out to the waiting Acquire calls of one
// Locker. It owns every goroutine it starts (hub owners and their readers,
// routing lookups), and close waits for all of them.
type notifier struct {
	client  redis.UniversalClient
	nodes   bool          // Cluster or Ring: one hub per node, found by routing each channel
	cluster bool          // Cluster: a node unreachable for reroute has its channels routed again
	linger  time.Duration // hubLinger; shortened by tests
	keep    time.Duration // channelLinger; shortened by tests
	log     *slog.Logger
	clock   Clock           // the Locker's: every time and timer of n and its hubs
	ctx     context.Context // cancelled by close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // Add only under mu while !closed
	reroute time.Duration  // how long a subscription may stay unconfirmed, or its node unreachable, before it is routed again

	mu       sync.Mutex
	closed   bool                  // guarded by mu; Locker.Close was called
	classic  bool                  // guarded by mu; the server has no sharded pub/sub
	channels map[string]*chanState // guarded by mu; channels with waiters
	hubs     map[string]*hub       // guarded by mu; by node address, "" for a single deployment
	seq      uint64                // guarded by mu; registrations so far
}

// chanState is one channel's waiters and the hub that subscribes to it.
type chanState struct {
	waiters map[*waiter]struct{}
	hub     *hub // nil while the channel is being routed or could not be
	routing bool
	idle    time.Time // when its last waiter left; zero while it has waiters
}

// A waiter is one waiting Acquire call's registration.
type waiter struct {
	n       *notifier
	channel string
	wake    chan struct{} // buffered: a pending wake-up
	also    []*waiter     // the same call's other registrations (see join); leave ends them too
	h       hearer        // what the call makes of the channel's messages
	seq     uint64        // the order of registration: one wake-up goes to the earliest
	wokeBy  *message      // the wake-up it got as one of many (see wakeOne); guarded by n.mu
}

// A hearer is what one kind of waiter makes of the messages on its channel
// (release.lua, redlock_release.lua); the notifier knows no payload. It is
// called with the notifier's mutex held.
type hearer interface {
	// hear tells what m, a message on w's channel (the empty payload: the
	// subscription's confirmation), does to w.
	hear(w *waiter, m message) hearing
	// lingers reports whether w's channel stays subscribed for
	// channelLinger after w, its last waiter, left.
	lingers(w *waiter) bool
}

// hearing is what a message does to a waiter.
type hearing int

const (
	ignore  hearing = iota
	wakeAll         // wake this waiter
	// wakeOne: wake this waiter or another that heard the same, the one
	// that registered first; the one woken passes the wake-up on if it
	// does not use it (waiter.passOn, waiter.leave).
	wakeOne
)

// everyMessage is the hearer of a waiter that every message wakes.
type everyMessage struct{}

func (everyMessage) hear(*waiter, message) hearing { return wakeAll }
func (everyMessage) lingers(*waiter) bool          { return false }

// A message is a payload published on a lock's channel, cut once by the
// connection that read it into its first word and the rest.
type message struct {
	payload    string
	head, rest string
}

func parseMessage(payload string) message {
	head, rest, _ := strings.Cut(payload, " ")
	return message{payload: payload, head: head, rest: rest}
}

// hubLinger is how long a hub stays open after its last waiter left, so that a
// steady stream of waits does not reconnect each time.
const hubLinger = 30 * time.Second

// channelLinger is how long a channel stays subscribed after its last waiter
// left, when that was a fair one or one in a Redlock line (on the line's
// node). A fair wait soon after (on a busy lock, each holder waits again
// after its work) then finds its subscription confirmed before its first
// attempt, and needs no keep-alive for a late confirmation; a Redlock line
// saves a subscription per wait. Plain waits do not linger: a holder that
// waits again at once would be woken as soon as the others, who wait longer
// (measured: Jain's fairness 0.90 instead of 0.998 with eight waiters, wait
// p99 twice).
const channelLinger = time.Second

// routeTimeout bounds the lookup of the node that serves a channel.
const routeTimeout = 5 * time.Second

func newNotifier(client redis.UniversalClient, log *slog.Logger, clock Clock) *notifier {
	_, cluster := client.(*redis.ClusterClient)
	_, ring := client.(*redis.Ring)
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{
		client: client, nodes: cluster || ring, cluster: cluster, linger: hubLinger, keep: channelLinger, log: log, clock: clock, ctx: ctx, cancel: cancel,
		reroute:  2 * time.Second,
		channels: make(map[string]*chanState), hubs: make(map[string]*hub),
	}
}

// register adds a waiter on channel and returns at once (nil after close).
// It is woken, on wake if not nil, by the channel's messages as h decides,
// the subscription's confirmation among them (at once if it already was).
func (n *notifier) register(channel string, wake chan struct{}, h hearer) *waiter {
	if wake == nil {
		wake = make(chan struct{}, 1)
	}
	w := &waiter{n: n, channel: channel, wake: wake, h: h}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.seq++
	w.seq = n.seq
	cs := n.channels[channel]
	if cs == nil {
		cs = &chanState{waiters: make(map[*waiter]struct{})}
		n.channels[channel] = cs
	}
	cs.waiters[w] = struct{}{}
	cs.idle = time.Time{}
	switch {
	case cs.hub != nil:
		if _, ok := cs.hub.confirmed[channel]; ok && h.hear(w, message{}) != ignore {
			w.signal() // subscribed: try now, a release may have come since the attempt
		}
	case !cs.routing:
		n.routeLocked(channel, cs, "")
	}
	return w
}

// join registers w's call on channel of n too, woken on w's channel.
func (w *waiter) join(n *notifier, channel string, h hearer) {
	if o := n.register(channel, w.wake, h); o != nil {
		w.also = append(w.also, o)
	}
}

// drain drops a pending wake-up of w: the caller is about to ask Redis,
// which answers for every release before.
func (w *waiter) drain() {
	select {
	case <-w.wake:
	default:
	}
}

// leave deregisters w; it never blocks on Redis. A wake-up w got as one of
// many and has not taken goes to the next such waiter. The last waiter on
// a channel has its hub unsubscribe it, after channelLinger if it lingers.
func (w *waiter) leave() {
	for _, o := range w.also {
		o.leave()
	}
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.channels[w.channel]
	if cs == nil {
		return
	}
	delete(cs.waiters, w)
	if w.wokeBy != nil && len(w.wake) > 0 {
		cs.deliverLocked(*w.wokeBy, true)
	}
	if len(cs.waiters) > 0 {
		return
	}
	if w.h.lingers(w) && cs.hub != nil && n.keep > 0 && !n.closed {
		cs.idle = n.clock.Now()
		cs.hub.kickLocked() // to end it after channelLinger
		return
	}
	delete(n.channels, w.channel)
	if cs.hub != nil {
		// Still confirmed until the hub unsubscribes it (sync): a waiter
		// that comes first finds it subscribed, and the hub sends nothing.
		delete(cs.hub.want, w.channel)
		cs.hub.kickLocked()
	}
}

// passOn gives a wake-up w got as one of many, and did not use (its try
// neither took the lock nor found it taken), to the next such waiter.
func (w *waiter) passOn() {
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.channels[w.channel]; cs != nil && w.wokeBy != nil {
		delete(cs.waiters, w)
		cs.deliverLocked(*w.wokeBy, true)
		cs.waiters[w] = struct{}{}
	}
	w.wokeBy = nil
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// routeLocked assigns channel to the hub of the node that serves it: the one
// hub of a single deployment at once, a node's hub on Cluster and Ring after
// a lookup on a goroutine of its own (it may ask the cluster for its slots).
//
// moved names the node that ended the channel's subscription because its
// slot moved, or that could not be reached for n.reroute (a crash, and a
// replica's takeover): the lookup waits, briefly, for the client to learn
// the slot's new master (go-redis reloads its slot map in the background).
func (n *notifier) routeLocked(channel string, cs *chanState, moved string) {
	if !n.nodes {
		n.attachLocked(channel, cs, "", n.client)
		return
	}
	cs.routing = true
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(n.ctx, routeTimeout)
		defer cancel()
		node, err := n.nodeFor(ctx, channel)
		for i := 0; moved != "" && err == nil && node.Options().Addr == moved && i < 50; i++ {
			if c, ok := n.client.(*redis.ClusterClient); ok {
				c.ReloadState(ctx)
			}
			t := n.clock.NewTimer(20 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			node, err = n.nodeFor(ctx, channel)
		}
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
		n.attachLocked(channel, cs, node.Options().Addr, node)
	}()
}

// nodeFor returns the client of the node that serves channel: the master of
// its slot on a Cluster, its shard on a Ring.
func (n *notifier) nodeFor(ctx context.Context, channel string) (*redis.Client, error) {
	switch c := n.client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, channel)
	case *redis.Ring:
		return c.GetShardClientForKey(channel)
	}
	return nil, errors.New("not a Cluster or Ring client")
}

// attachLocked subscribes channel on the hub for key, opening the hub if
// needed.
func (n *notifier) attachLocked(channel string, cs *chanState, key string, client subscriber) {
	h := n.hubs[key]
	if h == nil {
		ctx, cancel := context.WithCancel(n.ctx)
		h = &hub{
			n: n, key: key, client: client, ctx: ctx, cancel: cancel,
			kick: make(chan struct{}, 1), done: make(chan struct{}),
			want: make(map[string]struct{}), confirmed: make(map[string]struct{}),
		}
		n.hubs[key] = h
		n.wg.Add(1)
		go h.run()
	}
	cs.hub = h
	h.want[channel] = struct{}{}
	h.kickLocked()
	if _, ok := h.confirmed[channel]; ok { // still subscribed: its last waiter left just now
		for w := range cs.waiters {
			if w.h.hear(w, message{}) != ignore {
				w.signal()
			}
		}
	}
}

// rerouteLocked detaches channel from its hub and routes it again: its slot
// may have moved to another node (moved, if the node said so or is
// unreachable).
func (n *notifier) rerouteLocked(channel, moved string) {
	cs := n.channels[channel]
	if cs == nil || cs.routing {
		return
	}
	if cs.hub != nil {
		delete(cs.hub.want, channel)
		delete(cs.hub.confirmed, channel)
		cs.hub.kickLocked()
		cs.hub = nil
	}
	if len(cs.waiters) == 0 { // lingering: nobody needs it elsewhere
		delete(n.channels, channel)
		return
	}
	if c, ok := n.client.(*redis.ClusterClient); ok {
		c.ReloadState(n.ctx)
	}
	n.routeLocked(channel, cs, moved)
}

// wake gives the message payload to the waiters on channel.
func (n *notifier) wake(channel, payload string) {
	m := parseMessage(payload)
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.channels[channel]; cs != nil {
		cs.deliverLocked(m, false)
	}
}

// signalLocked wakes every waiter on the channels of h, of every hub if nil.
func (n *notifier) signalLocked(h *hub) {
	for _, cs := range n.channels {
		if h == nil || cs.hub == h {
			for w := range cs.waiters {
				w.signal()
			}
		}
	}
}

// deliverLocked wakes the waiters m wakes, and the earliest of those it
// wakes one of; with onlyOne, only that one (a wake-up passed on).
func (cs *chanState) deliverLocked(m message, onlyOne bool) {
	var one *waiter
	for w := range cs.waiters {
		switch w.h.hear(w, m) {
		case wakeAll:
			if !onlyOne {
				w.signal()
			}
		case wakeOne:
			// One with a wake-up pending tries anyway: the message is for
			// another, or a second release (a semaphore's) is lost.
			if len(w.wake) == 0 && (one == nil || w.seq < one.seq) {
				one = w
			}
		}
	}
	if one != nil {
		one.wokeBy = &m
		one.signal()
	}
}

// close shuts every hub down and waits for every goroutine of n, until by
// at most: a hub in a call to a hung server ends when go-redis gives up on
// it. The waiters are woken; Locker.Close has ended their calls.
func (n *notifier) close(by time.Time) {
	n.mu.Lock()
	n.closed = true
	for _, h := range n.hubs {
		h.closed = true
		h.kickLocked()
	}
	n.signalLocked(nil)
	n.mu.Unlock()
	n.cancel()
	done := make(chan struct{})
	go func() { // ends with the last of n's goroutines (no Add after closed)
		n.wg.Wait()
		close(done)
	}()
	tasks.WaitUntil(n.clock, done, by)
}

// subscriber opens subscription connections: a client for one node, or the
// Locker's client on a single deployment.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// A hub is one subscription connection to one node, and its owner
// goroutine, run.
type hub struct {
	n      *notifier
	key    string     // node address; "" for a single deployment
	client subscriber // opens the connection
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // buffered: the wanted channels changed, or the hub is closed
	done   chan struct{} // closed when run has returned

	want      map[string]struct{} // guarded by n.mu; channels with waiters routed here
	confirmed map[string]struct{} // guarded by n.mu; subscribed, as the server confirmed
	closed    bool                // guarded by n.mu; shut down: run exits
	reached   time.Time           // only run touches it; the time the last of its timers was set for
}

// now is the hub's time: the clock's, or the time its last timer was set
// for if that is later. The timer's firing says that time has come, so
// each firing moves the hub on, whatever the clock's Now says (see Clock).
func (h *hub) now() time.Time {
	now := h.n.clock.Now()
	if now.Before(h.reached) {
		return h.reached
	}
	return now
}

func (h *hub) kickLocked() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// conn is one subscription connection and its reader goroutine; only the
// hub's owner goroutine touches it.
type conn struct {
	ps      *redis.PubSub // nil until the first subscription
	sharded bool
	reading bool                 // the reader was started
	msgs    chan any             // messages and errors, from the reader
	quit    chan struct{}        // closed to stop the reader
	done    chan struct{}        // closed when the reader has exited
	opened  time.Time            // when the server first answered on it; zero until then
	sent    map[string]time.Time // channels subscribed, and when
	unsent  map[string]int       // our unsubscriptions whose confirmation has not come yet
}

func newConn(sharded bool) *conn {
	return &conn{sharded: sharded, msgs: make(chan any), quit: make(chan struct{}),
		done: make(chan struct{}), sent: make(map[string]time.Time), unsent: make(map[string]int)}
}

// close closes the connection and waits for its reader.
func (c *conn) close() {
	close(c.quit)
	if c.ps != nil {
		_ = c.ps.Close()
	}
	if c.reading {
		<-c.done
	}
}

// forgive starts the reopen backoff over if c, now ending, lasted for its
// longest step: a connection that breaks after a while is reopened at once,
// one that breaks as soon as it is opened ever less often.
func (c *conn) forgive(reopen *backoff.Backoff, now time.Time) {
	if !c.opened.IsZero() && !now.Before(c.opened.Add(reopen.Max)) {
		reopen.Reset()
	}
}

// read is a connection's reader goroutine. It wakes the waiters of a
// channel's messages itself, the shortest way from a release to its waiter
// (a grant's), and hands everything else to the owner. It stops at the
// first error that is not a Redis error reply: go-redis would reconnect and
// subscribe every channel in one command, which a Cluster refuses
// (CROSSSLOT), so the owner opens a new connection instead.
func (c *conn) read(n *notifier) {
	defer close(c.done)
	for {
		msg, err := c.ps.Receive(context.Background())
		if err != nil {
			msg = err
		}
		if m, ok := msg.(*redis.Message); ok {
			n.wake(m.Channel, m.Payload)
			continue
		}
		select {
		case c.msgs <- msg:
		case <-c.quit:
			return
		}
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			return
		}
	}
}

// run is the hub's owner goroutine: it subscribes and unsubscribes as the
// wanted channels change, wakes waiters on confirmations,
// reconnects after errors, and closes the hub once it has had no channel
// for the linger time.
func (h *hub) run() {
	n := h.n
	defer n.wg.Done()
	defer close(h.done)
	defer h.cancel()
	defer func() {
		n.mu.Lock()
		if n.hubs[h.key] == h {
			delete(n.hubs, h.key)
		}
		n.mu.Unlock()
	}()

	var (
		c       *conn
		reopen  = backoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
		retryAt time.Time // no new connection before then
		idle    time.Time // when the hub last had no channel; zero while it has some
		failing time.Time // since when no connection to the node could be made; zero after one was
	)
	// end retires the hub if it has still no channel, and reports whether
	// it did.
	end := func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		if len(h.want) > 0 {
			return false
		}
		h.closed = true
		delete(n.hubs, h.key)
		return true
	}
	drop := func() {
		if c == nil {
			return
		}
		c.close()
		c = nil
		n.mu.Lock()
		clear(h.confirmed)
		n.mu.Unlock()
	}
	defer drop()

	for {
		n.mu.Lock()
		if h.closed {
			n.mu.Unlock()
			return
		}
		now := h.now()
		lingerEnd := h.endLingersLocked(now)
		want := make([]string, 0, len(h.want))
		for ch := range h.want {
			want = append(want, ch)
		}
		classic := n.classic
		n.mu.Unlock()

		var due time.Time // when to look again; zero: at a change or a message
		switch {
		case len(want) == 0 && c == nil && !failing.IsZero():
			// Nothing to linger for: the node is unreachable, and its
			// channels left (routed elsewhere, or their waiters did).
			if end() {
				return
			}
			continue
		case len(want) == 0 && (c == nil || len(c.sent) == 0):
			if idle.IsZero() {
				idle = now
			}
			if !now.Before(idle.Add(n.linger)) {
				if end() {
					return
				}
				continue
			}
			due = idle.Add(n.linger)
		case c == nil && now.Before(retryAt):
			idle = time.Time{}
			due = retryAt
		default:
			idle = time.Time{}
			if c == nil {
				c = newConn(!classic)
			}
			if err := h.sync(c, want); err != nil {
				n.log.LogAttrs(h.ctx, slog.LevelDebug, "fencelock: wake-up subscription failed",
					slog.String("node", h.key), slog.Any("error", err))
				c.forgive(&reopen, h.now())
				drop()
				now := h.now()
				if failing.IsZero() {
					failing = now
				}
				if n.cluster && !now.Before(failing.Add(n.reroute)) {
					// Unreachable for a while: the node may have
					// crashed and a replica taken over its slots.
					// Route its channels again; checkPending never
					// runs here, as no sync succeeds. Not on a Ring:
					// a shard that comes back takes its keys back,
					// and nothing would move the channels back.
					// On a Cluster, a failed master comes back a
					// replica, and a slot moved back ends its
					// subscriptions (handle).
					n.mu.Lock()
					h.rerouteAllLocked()
					n.mu.Unlock()
					failing = now // for channels routed here again
				}
				retryAt = now.Add(reopen.Next())
				continue
			}
			failing = time.Time{}
			due = h.checkPending(c)
		}
		due = earliest(due, lingerEnd)
		// A new timer from the clock each time, never a Reset (which
		// would bypass a Clock that is not the system's), and none
		// when nothing is due: no loop on a timer with nothing to do.
		var timer *time.Timer
		var fired <-chan time.Time
		if !due.IsZero() {
			timer = n.clock.NewTimer(due.Sub(now))
			fired = timer.C
		}

		var msgs <-chan any
		if c != nil && c.reading {
			msgs = c.msgs
		}
		select {
		case <-h.kick:
		case <-fired:
			h.reached = due
		case m := <-msgs:
			if !h.handle(c, m) {
				// The connection broke, or the server has no sharded
				// pub/sub: messages may have been lost, so every waiter
				// tries again; then open a new connection.
				c.forgive(&reopen, h.now())
				drop()
				n.mu.Lock()
				n.signalLocked(h)
				n.mu.Unlock()
				retryAt = h.now().Add(reopen.Next())
			}
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// endLingersLocked stops wanting the channels whose last waiter left
// channelLinger ago, and returns when the next lingering one ends (zero if
// none lingers).
func (h *hub) endLingersLocked(now time.Time) (next time.Time) {
	n := h.n
	for ch := range h.want {
		cs := n.channels[ch]
		if cs == nil || cs.hub != h || len(cs.waiters) > 0 || cs.idle.IsZero() {
			continue
		}
		end := cs.idle.Add(n.keep)
		if now.Before(end) {
			next = earliest(next, end)
			continue
		}
		delete(h.want, ch)
		delete(h.confirmed, ch) // unsubscribed next: a new waiter waits for a new confirmation
		delete(n.channels, ch)
	}
	return next
}

// sync subscribes the wanted channels that are not subscribed yet and
// unsubscribes those no longer wanted, one command per channel (a Cluster
// refuses a command whose channels are in different slots). The first
// subscription opens the connection; then the reader starts.
func (h *hub) sync(c *conn, want []string) error {
	wanted := make(map[string]struct{}, len(want))
	for _, ch := range want {
		wanted[ch] = struct{}{}
		if _, ok := c.sent[ch]; ok {
			continue
		}
		var err error
		switch {
		case c.ps == nil && c.sharded:
			c.ps = h.client.SSubscribe(h.ctx, ch)
			err = c.ps.Ping(h.ctx) // go-redis swallows the error of the connection's dial: PING finds it
		case c.ps == nil:
			c.ps = h.client.Subscribe(h.ctx, ch)
			err = c.ps.Ping(h.ctx)
		case c.sharded:
			err = c.ps.SSubscribe(h.ctx, ch)
		default:
			err = c.ps.Subscribe(h.ctx, ch)
		}
		if err != nil {
			return err
		}
		if c.opened.IsZero() {
			c.opened = h.now()
		}
		c.sent[ch] = h.now()
		if !c.reading {
			c.reading = true
			go c.read(h.n)
		}
	}
	for ch := range c.sent {
		if _, ok := wanted[ch]; ok {
			continue
		}
		delete(c.sent, ch)
		c.unsent[ch]++
		h.n.mu.Lock()
		delete(h.confirmed, ch)
		h.n.mu.Unlock()
		var err error
		if c.sharded {
			err = c.ps.SUnsubscribe(h.ctx, ch)
		} else {
			err = c.ps.Unsubscribe(h.ctx, ch)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// handle acts on a message from c's reader. It returns false when the
// connection must be replaced.
func (h *hub) handle(c *conn, m any) bool {
	n := h.n
	switch m := m.(type) {
	case *redis.Subscription: // messages never come here: the reader wakes their waiters
		switch m.Kind {
		case "subscribe", "ssubscribe":
			// Confirmed while the connection is subscribed, wanted or not:
			// a waiter may come before sync unsubscribes it.
			if _, ok := c.sent[m.Channel]; ok {
				n.mu.Lock()
				h.confirmed[m.Channel] = struct{}{}
				n.mu.Unlock()
			}
			// Releases before the confirmation may have been missed:
			// the waiters try now.
			n.wake(m.Channel, "")
		case "unsubscribe", "sunsubscribe":
			if c.unsent[m.Channel] > 0 {
				// The confirmation of our own unsubscription, even if
				// the channel was subscribed again since.
				if c.unsent[m.Channel]--; c.unsent[m.Channel] == 0 {
					delete(c.unsent, m.Channel)
				}
				return true
			}
			if _, ok := c.sent[m.Channel]; !ok {
				return true
			}
			// The server ended the subscription: the channel's slot moved
			// to another node. Subscribe it where it is now.
			delete(c.sent, m.Channel)
			n.mu.Lock()
			delete(h.confirmed, m.Channel)
			if n.nodes {
				n.rerouteLocked(m.Channel, h.key)
			}
			h.kickLocked()
			n.mu.Unlock()
			n.wake(m.Channel, "")
		}
	case *redis.Pong:
	case error:
		var rerr redis.Error
		if !errors.As(m, &rerr) {
			return false
		}
		if c.sharded && isUnknownCommand(m) {
			n.mu.Lock()
			n.classic = true
			n.mu.Unlock()
			return false
		}
		// A refused subscription (MOVED after a slot moved, an ACL
		// without the channel): the channel stays unconfirmed, its
		// waiters poll, and checkPending routes it again.
		n.log.LogAttrs(h.ctx, slog.LevelDebug, "fencelock: wake-up subscription refused",
			slog.String("node", h.key), slog.Any("error", m))
	}
	return true
}

// checkPending routes again the channels whose subscription has not been
// confirmed for a while (refused, or its confirmation lost), and returns
// when to check next: zero if no channel waits for its confirmation.
func (h *hub) checkPending(c *conn) (next time.Time) {
	n := h.n
	now := h.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch, at := range c.sent {
		if _, ok := h.confirmed[ch]; ok {
			continue
		}
		if due := at.Add(n.reroute); due.After(now) {
			next = earliest(next, due)
			continue
		}
		delete(c.sent, ch)
		if n.nodes {
			n.rerouteLocked(ch, "") // unsubscribed by the next sync if it moved
		}
		next = now
	}
	return next
}

// rerouteAllLocked routes every channel of h again, as the lookup of its
// node would find it now, once go-redis has learnt the slot's new master (see
// routeLocked).
func (h *hub) rerouteAllLocked() {
	n := h.n
	for ch := range h.want {
		if cs := n.channels[ch]; cs == nil || cs.hub != h {
			delete(h.want, ch)
			continue
		}
		n.rerouteLocked(ch, h.key)
	}
}

// earliest returns the earlier of a and b, the zero time meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

func isUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	// PUBSUB SHARDNUMSUB before Redis 7: "ERR Unknown subcommand ..."
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}
