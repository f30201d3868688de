package notify

import (
	"context"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
)

// A hub is one subscription connection to one node, and its owner
// goroutine, run, which alone touches the fields after closed.
type hub struct {
	n      *Notifier
	key    string // node address; "" on Single
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // buffered: the wanted channels changed, or the hub is closed

	want      map[string]struct{} // guarded by n.mu; channels with waiters routed here
	confirmed map[string]struct{} // guarded by n.mu; subscribed, as the server confirmed
	closed    bool                // guarded by n.mu; shut down: run exits

	c       *conn           // nil while no connection is open
	reopen  backoff.Backoff // the pause before a new connection after one failed
	retryAt time.Time       // no new connection before then
	idle    time.Time       // since when the hub has had no channel; zero while it has some
	failing time.Time       // since when no connection to the node could be made; zero after one was
	reached time.Time       // what the last of its timers was set for
}

func newHub(n *Notifier, key string) *hub {
	ctx, cancel := context.WithCancel(n.ctx)
	return &hub{n: n, key: key, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		want: make(map[string]struct{}), confirmed: make(map[string]struct{}),
		reopen: backoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}}
}

// now is the clock's time, or the time the last timer fired for if that is
// later: a firing moves the hub on whatever the clock's Now says.
func (h *hub) now() time.Time {
	now := h.n.clock.Now()
	if now.Before(h.reached) {
		return h.reached
	}
	return now
}

// run is the hub's owner goroutine, started by attachLocked; it returns once
// the hub is closed, by Close or after it had no channel for the linger time.
func (h *hub) run() {
	n := h.n
	defer n.wg.Done()
	defer h.cancel()
	defer func() {
		n.mu.Lock()
		if n.hubs[h.key] == h {
			delete(n.hubs, h.key)
		}
		n.mu.Unlock()
	}()
	defer h.drop()
	for {
		now := h.now()
		want, lingerEnd, ok := h.look(now)
		if !ok {
			return
		}
		due, again := h.step(now, want)
		if !again {
			h.wait(now, earliest(due, lingerEnd))
		}
	}
}

// look returns the channels to subscribe and when the next lingering one
// ends (zero if none); ok is false once the hub is closed.
func (h *hub) look(now time.Time) (want []string, lingerEnd time.Time, ok bool) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if h.closed {
		return nil, time.Time{}, false
	}
	lingerEnd = h.endLingersLocked(now)
	want = make([]string, 0, len(h.want))
	for ch := range h.want {
		want = append(want, ch)
	}
	return want, lingerEnd, true
}

// step does what the wanted channels need, and returns when to look again
// (zero: at a change or a message); again: at once.
func (h *hub) step(now time.Time, want []string) (due time.Time, again bool) {
	switch {
	case len(want) == 0 && (h.c == nil || len(h.c.sent) == 0):
		if h.idle.IsZero() {
			h.idle = now
		}
		end := h.idle.Add(time.Duration(h.n.linger.Load()))
		if !now.Before(end) || h.c == nil && !h.failing.IsZero() { // no linger for an unreachable node
			h.end()
			return time.Time{}, true
		}
		return end, false
	case h.c == nil && now.Before(h.retryAt):
		h.idle = time.Time{}
		return h.retryAt, false
	}
	h.idle = time.Time{}
	if h.c == nil {
		h.n.mu.Lock()
		sharded := !h.n.classic
		h.n.mu.Unlock()
		h.c = newConn(h.n.net.Open(h.key, sharded), sharded)
	}
	if err := h.sync(want); err != nil {
		h.failed(err)
		return time.Time{}, true
	}
	h.failing = time.Time{}
	return h.checkPending(), false
}

// end closes the hub if it has still no channel: run then returns.
func (h *hub) end() {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(h.want) == 0 {
		h.closed = true
		delete(n.hubs, h.key)
	}
}

// wait waits for a change, an event, or due on the clock.
func (h *hub) wait(now, due time.Time) {
	// A new timer each time: Reset would bypass a Clock not the system's.
	var fired <-chan time.Time
	if !due.IsZero() {
		timer := h.n.clock.NewTimer(due.Sub(now))
		defer timer.Stop()
		fired = timer.C
	}
	var events <-chan Event
	if h.c != nil && h.c.reading {
		events = h.c.events
	}
	select {
	case <-h.kick:
	case <-fired:
		h.reached = due
	case e := <-events:
		if !h.handle(e) {
			// Messages may have been lost: every waiter tries again.
			h.drop()
			h.n.mu.Lock()
			h.n.signalLocked(h)
			h.n.mu.Unlock()
			h.retryAt = h.now().Add(h.reopen.Next())
		}
	}
}

// failed drops the connection whose subscription failed with err, and on a
// Cluster reroutes the hub's channels once the node was unreachable for a while.
func (h *hub) failed(err error) {
	n := h.n
	n.log.LogAttrs(h.ctx, slog.LevelDebug, "fencelock: wake-up subscription failed",
		slog.String("node", h.key), slog.Any("error", err))
	h.drop()
	now := h.now()
	if h.failing.IsZero() {
		h.failing = now
	}
	if n.topo == Cluster && !now.Before(h.failing.Add(n.reroute)) {
		// A replica may have taken the slots over. Not on a Ring: a shard
		// that comes back takes its keys back, which nothing would notice.
		n.mu.Lock()
		h.rerouteAllLocked()
		n.mu.Unlock()
		h.failing = now // for channels routed here again
	}
	h.retryAt = now.Add(h.reopen.Next())
}

// drop closes the hub's connection, if any, and starts the reopen backoff over
// if it lasted its longest step: one that breaks at once reopens ever later.
func (h *hub) drop() {
	if h.c == nil {
		return
	}
	if o := h.c.opened; !o.IsZero() && !h.now().Before(o.Add(h.reopen.Max)) {
		h.reopen.Reset()
	}
	h.c.close()
	h.c = nil
	h.n.mu.Lock()
	clear(h.confirmed)
	h.n.mu.Unlock()
}

// endLingersLocked stops wanting the channels whose last waiter left
// ChannelLinger ago, and returns when the next lingering one ends (or zero).
func (h *hub) endLingersLocked(now time.Time) (next time.Time) {
	n := h.n
	for ch := range h.want {
		cs := n.channels[ch]
		if cs == nil || cs.hub != h || len(cs.waiters) > 0 || cs.idle.IsZero() {
			continue
		}
		end := cs.idle.Add(time.Duration(n.keep.Load()))
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

// sync subscribes the wanted channels and unsubscribes the others, one
// command per channel (a Cluster refuses channels of different slots).
func (h *hub) sync(want []string) error {
	c := h.c
	wanted := make(map[string]struct{}, len(want))
	for _, ch := range want {
		wanted[ch] = struct{}{}
		if _, ok := c.sent[ch]; ok {
			continue
		}
		if err := c.cn.Subscribe(h.ctx, ch); err != nil {
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
		if err := c.cn.Unsubscribe(h.ctx, ch); err != nil {
			return err
		}
	}
	return nil
}

// handle acts on an event from the reader; false: replace the connection.
func (h *hub) handle(e Event) bool {
	n := h.n
	switch e.Kind {
	case Subscribed:
		// Wanted or not: a waiter may come before sync unsubscribes it.
		if _, ok := h.c.sent[e.Channel]; ok {
			n.mu.Lock()
			h.confirmed[e.Channel] = struct{}{}
			n.mu.Unlock()
		}
		n.wake(e.Channel, "")
	case Unsubscribed:
		h.unsubscribed(e.Channel)
	case Refused:
		if h.c.sharded && e.Unknown {
			n.mu.Lock()
			n.classic = true
			n.mu.Unlock()
			return false
		}
		// MOVED, or an ACL without the channel: its waiters poll, and
		// checkPending routes it again.
		n.log.LogAttrs(h.ctx, slog.LevelDebug, "fencelock: wake-up subscription refused",
			slog.String("node", h.key), slog.Any("error", e.Err))
	case Broken:
		return false
	}
	return true // Published never comes here: the reader wakes its waiters
}

// unsubscribed acts on the end of channel's subscription: its own, or the
// server's after the channel's slot moved, which routes it again.
func (h *hub) unsubscribed(channel string) {
	c, n := h.c, h.n
	if c.unsent[channel] > 0 {
		if c.unsent[channel]--; c.unsent[channel] == 0 {
			delete(c.unsent, channel)
		}
		return
	}
	if _, ok := c.sent[channel]; !ok {
		return
	}
	delete(c.sent, channel)
	n.mu.Lock()
	delete(h.confirmed, channel)
	n.rerouteLocked(channel, h.key)
	poke(h.kick)
	n.mu.Unlock()
	n.wake(channel, "")
}

// checkPending routes again the channels unconfirmed for n.reroute, and
// returns when to check next: zero if no channel waits for a confirmation.
func (h *hub) checkPending() (next time.Time) {
	n := h.n
	now := h.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch, at := range h.c.sent {
		if _, ok := h.confirmed[ch]; ok {
			continue
		}
		if due := at.Add(n.reroute); due.After(now) {
			next = earliest(next, due)
			continue
		}
		delete(h.c.sent, ch)
		n.rerouteLocked(ch, "") // unsubscribed by the next sync if it moved
		next = now
	}
	return next
}

// rerouteAllLocked routes every channel of h again (see Notifier.route).
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

// conn is one subscription connection and its reader goroutine; only the
// hub's run touches it.
type conn struct {
	cn      Conn
	sharded bool
	reading bool                 // the reader was started
	events  chan Event           // from the reader: all but messages
	quit    chan struct{}        // closed to stop the reader
	done    chan struct{}        // closed when the reader has exited
	opened  time.Time            // when the server first answered on it; zero until then
	sent    map[string]time.Time // channels subscribed, and when
	unsent  map[string]int       // our unsubscriptions whose confirmation has not come yet
}

func newConn(c Conn, sharded bool) *conn {
	return &conn{cn: c, sharded: sharded, events: make(chan Event), quit: make(chan struct{}),
		done: make(chan struct{}), sent: make(map[string]time.Time), unsent: make(map[string]int)}
}

// close closes the connection and waits for its reader.
func (c *conn) close() {
	close(c.quit)
	_ = c.cn.Close()
	if c.reading {
		<-c.done
	}
}

// read is a connection's reader goroutine, started by sync, waited for by
// close, and ended by Broken; it hands every event but a message to run.
func (c *conn) read(n *Notifier) {
	defer close(c.done)
	for {
		e := c.cn.Receive(context.Background())
		if e.Kind == Published {
			n.wake(e.Channel, e.Payload)
			continue
		}
		select {
		case c.events <- e:
		case <-c.quit:
			return
		}
		if e.Kind == Broken {
			return
		}
	}
}
