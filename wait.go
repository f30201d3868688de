package fencelock

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Push-based waiting, as documented in GUARANTEES.md ("Waiting"): the release
// script publishes on a channel named like the lock key, and waiting Acquire
// calls listen through a notifier.
//
// A waiter's registration and departure only change maps under notifier.mu
// and kick a hub: subscribing and unsubscribing never sit on Acquire's
// return path nor on another waiter's registration. Each hub is one
// subscription connection to one node, owned by one goroutine (run), which
// takes the changes and the connection's confirmations and errors over
// channels; the connection's reader wakes the waiters of a message itself.

// notifier fans release announcements out to the waiting Acquire calls of one
// Locker. It owns every goroutine it starts (hub owners and their readers,
// routing lookups), and close waits for all of them.
type notifier struct {
	client  redis.UniversalClient
	nodes   bool          // Cluster or Ring: one hub per node, found by routing each channel
	linger  time.Duration // hubLinger; shortened by tests
	keep    time.Duration // channelLinger; shortened by tests
	log     *slog.Logger
	ctx     context.Context // cancelled by close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // Add only under mu while !closed
	reroute time.Duration  // how long a subscription may stay unconfirmed before it is routed again

	mu       sync.Mutex
	closed   bool                  // guarded by mu; Locker.Close was called
	classic  bool                  // guarded by mu; the server has no sharded pub/sub
	channels map[string]*chanState // guarded by mu; channels with waiters
	hubs     map[string]*hub       // guarded by mu; by node address, "" for a single deployment
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
	also    []*waiter     // the same call's registrations on the other nodes of a quorum
	token   string        // a fair waiter's token: "granted <token> <fence>" is for it
	granted chan int64    // buffered; a fair waiter's grant, with its fence
	// line is the waiting Acquire's place in a Redlock line, shared by its
	// registrations on the quorum's nodes (nil outside a Redlock); home is
	// set on the registration with the line's node. While the Acquire is
	// in line, "next <id>" wakes it only when it names it, and "released"
	// only from the line's node (see notifier.wake).
	line *line
	home bool
}

// hubLinger is how long a hub stays open after its last waiter left, so that a
// steady stream of waits does not reconnect each time.
const hubLinger = 30 * time.Second

// channelLinger is how long a channel stays subscribed after its last waiter
// left, when that was a fair one, or one in a Redlock line (on the line's
// node). A fair wait that comes soon after (on a busy lock, each holder
// waits again after its work) then finds its subscription confirmed before
// its first attempt, which answers for every release before it: no
// keep-alive follows a confirmation; a wait in a Redlock line is named when
// its turn comes, and saves a subscription per wait. Plain waits do not
// linger: a holder that waits again at once would then be woken as soon as
// the others, and the others, on a busy lock, wait longer (measured:
// Jain's fairness 0.90 instead of 0.998 with eight waiters, wait p99 twice).
const channelLinger = time.Second

// routeTimeout bounds the lookup of the node that serves a channel.
const routeTimeout = 5 * time.Second

func newNotifier(client redis.UniversalClient, log *slog.Logger) *notifier {
	var nodes bool
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		nodes = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{
		client: client, nodes: nodes, linger: hubLinger, keep: channelLinger, log: log, ctx: ctx, cancel: cancel,
		reroute:  2 * time.Second,
		channels: make(map[string]*chanState), hubs: make(map[string]*hub),
	}
}

// register adds a waiter on channel and returns at once; it returns nil
// after close. The waiter is woken, on wake if not nil, when its channel's
// subscription is confirmed (at once if it already was), and on every
// release (but see waiter.line).
func (n *notifier) register(channel string, wake chan struct{}, token string, ln *line, home bool) *waiter {
	if wake == nil {
		wake = make(chan struct{}, 1)
	}
	w := &waiter{n: n, channel: channel, wake: wake, token: token, line: ln, home: home}
	if token != "" {
		w.granted = make(chan int64, 1)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	cs := n.channels[channel]
	if cs == nil {
		cs = &chanState{waiters: make(map[*waiter]struct{})}
		n.channels[channel] = cs
	}
	cs.waiters[w] = struct{}{}
	cs.idle = time.Time{}
	switch {
	case cs.hub != nil:
		if _, ok := cs.hub.confirmed[channel]; ok && w.wakesOnConfirmation() {
			w.signal() // subscribed: try now, a release may have come since the attempt
		}
	case !cs.routing:
		n.routeLocked(channel, cs, "")
	}
	return w
}

// drain drops a pending wake-up of w: the caller is about to ask Redis,
// which answers for every release before.
func (w *waiter) drain() {
	select {
	case <-w.wake:
	default:
	}
}

// leave deregisters w; it never blocks on Redis. The last waiter on a channel
// has its hub unsubscribe it, after channelLinger if that waiter was fair.
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
	if len(cs.waiters) > 0 {
		return
	}
	if (w.token != "" || (w.line != nil && w.home)) && cs.hub != nil && n.keep > 0 && !n.closed {
		cs.idle = time.Now()
		cs.hub.kickLocked() // to end it after channelLinger
		return
	}
	delete(n.channels, w.channel)
	if cs.hub != nil {
		delete(cs.hub.want, w.channel)
		delete(cs.hub.confirmed, w.channel) // unsubscribed next: a new waiter waits for a new confirmation
		cs.hub.kickLocked()
	}
}

// wakesOnConfirmation reports whether w tries again when its subscription
// is confirmed: a release before may have been missed. Not an Acquire in a
// Redlock line with others ahead of it: a release before named one of
// those.
func (w *waiter) wakesOnConfirmation() bool {
	return w.line == nil || !w.line.in.Load() || w.line.first.Load()
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
// slot moved: the lookup waits, briefly, for the client to learn the slot's
// new master (go-redis reloads its slot map in the background).
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
			t := time.NewTimer(20 * time.Millisecond)
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
}

// rerouteLocked detaches channel from its hub and routes it again: its slot
// may have moved to another node (moved, if the node said so).
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

// wake signals the waiters on channel, or, when channel is "", those on
// every channel of h. A grant ("granted <token> <fence>", from a release
// that handed the lock to a fair waiter) goes to its waiter only: the lock
// is held again, so the others have nothing to try. On a Redlock, an
// Acquire in a node's line is woken by that node's "next <id>" naming it
// and by its "released" (the line is empty), not by the other nodes'
// releases nor by another's turn; waiters not in line wake on every one.
func (n *notifier) wake(h *hub, channel, payload string) {
	m := parseMessage(payload)
	n.mu.Lock()
	defer n.mu.Unlock()
	if channel != "" {
		if cs := n.channels[channel]; cs != nil {
			for w := range cs.waiters {
				w.hear(m)
			}
		}
		return
	}
	for _, cs := range n.channels {
		if cs.hub == h {
			for w := range cs.waiters {
				w.signal()
			}
		}
	}
}

// A message is what a release published on a lock's channel (release.lua,
// redlock_release.lua), parsed once by the connection that read it; the
// empty payload stands for a subscription's confirmation.
type message struct {
	payload string
	grantee string // "granted <token> <fence>": the fair waiter handed the lock
	fence   int64
	named   string // "next <id>": the Acquire in a Redlock line whose turn it is
}

func parseMessage(payload string) message {
	m := message{payload: payload}
	if rest, ok := strings.CutPrefix(payload, "granted "); ok {
		var fence string
		m.grantee, fence, _ = strings.Cut(rest, " ")
		m.fence, _ = strconv.ParseInt(fence, 10, 64)
	} else if rest, ok := strings.CutPrefix(payload, "next "); ok {
		m.named = rest
	}
	return m
}

// hear wakes w if m is for it: a grant only its grantee, which gets the
// fence; a waiter in a Redlock line as its line decides (line.hears); any
// other waiter on every message. Called with w.n.mu held.
func (w *waiter) hear(m message) {
	switch {
	case m.grantee != "":
		if w.token == m.grantee && m.fence > 0 {
			select {
			case w.granted <- m.fence:
			default:
			}
		}
		return
	case w.line != nil && !w.line.hears(w, m):
		return
	}
	w.signal()
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
	for _, cs := range n.channels {
		for w := range cs.waiters {
			w.signal()
		}
	}
	n.mu.Unlock()
	n.cancel()
	done := make(chan struct{})
	go func() { // ends with the last of n's goroutines (no Add after closed)
		n.wg.Wait()
		close(done)
	}()
	waitUntil(done, by)
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
			n.wake(nil, m.Channel, m.Payload)
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
		reopen  = backoff{min: 10 * time.Millisecond, max: time.Second}
		retryAt time.Time // no new connection before then
		idle    time.Time // when the hub last had no channel; zero while it has some
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
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
		now := time.Now()
		lingerEnd := h.endLingersLocked(now)
		want := make([]string, 0, len(h.want))
		for ch := range h.want {
			want = append(want, ch)
		}
		classic := n.classic
		n.mu.Unlock()

		var wait time.Duration
		switch {
		case len(want) == 0 && (c == nil || len(c.sent) == 0):
			if idle.IsZero() {
				idle = now
			}
			if !now.Before(idle.Add(n.linger)) {
				n.mu.Lock()
				if len(h.want) == 0 {
					h.closed = true
					delete(n.hubs, h.key)
					n.mu.Unlock()
					return
				}
				n.mu.Unlock()
				continue
			}
			wait = idle.Add(n.linger).Sub(now)
		case c == nil && now.Before(retryAt):
			idle = time.Time{}
			wait = retryAt.Sub(now)
		default:
			idle = time.Time{}
			if c == nil {
				c = newConn(!classic)
			}
			if err := h.sync(c, want); err != nil {
				n.log.LogAttrs(h.ctx, slog.LevelDebug, "fencelock: wake-up subscription failed",
					slog.String("node", h.key), slog.Any("error", err))
				drop()
				retryAt = time.Now().Add(reopen.next())
				continue
			}
			wait = h.checkPending(c)
		}
		if !lingerEnd.IsZero() {
			wait = min(wait, lingerEnd.Sub(now))
		}
		timer.Reset(wait)

		var msgs <-chan any
		if c != nil && c.reading {
			msgs = c.msgs
		}
		select {
		case <-h.kick:
		case <-timer.C:
		case m := <-msgs:
			if h.handle(c, m) {
				continue
			}
			// The connection broke, or the server has no sharded
			// pub/sub: messages may have been lost, so every waiter
			// tries again; then open a new connection.
			drop()
			n.wake(h, "", "")
			retryAt = time.Now().Add(reopen.next())
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
			if next.IsZero() || end.Before(next) {
				next = end
			}
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
			err = ping(h.ctx, c.ps)
		case c.ps == nil:
			c.ps = h.client.Subscribe(h.ctx, ch)
			err = ping(h.ctx, c.ps)
		case c.sharded:
			err = c.ps.SSubscribe(h.ctx, ch)
		default:
			err = c.ps.Subscribe(h.ctx, ch)
		}
		if err != nil {
			return err
		}
		c.sent[ch] = time.Now()
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

// ping checks that a new subscription connection could be made: go-redis
// creating one with SSubscribe or Subscribe swallows the dial's error.
func ping(ctx context.Context, ps *redis.PubSub) error {
	return ps.Ping(ctx)
}

// handle acts on a message from c's reader. It returns false when the
// connection must be replaced.
func (h *hub) handle(c *conn, m any) bool {
	n := h.n
	switch m := m.(type) {
	case *redis.Subscription: // messages never come here: the reader wakes their waiters
		switch m.Kind {
		case "subscribe", "ssubscribe":
			n.mu.Lock()
			if _, ok := h.want[m.Channel]; ok {
				h.confirmed[m.Channel] = struct{}{}
			}
			n.mu.Unlock()
			// Releases before the confirmation may have been missed:
			// the waiters try now.
			n.wake(nil, m.Channel, "")
		case "unsubscribe", "sunsubscribe":
			if k := c.unsent[m.Channel]; k > 0 {
				// The confirmation of our own unsubscription, even if
				// the channel was subscribed again since.
				if k == 1 {
					delete(c.unsent, m.Channel)
				} else {
					c.unsent[m.Channel] = k - 1
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
			n.wake(nil, m.Channel, "")
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
// when to check next.
func (h *hub) checkPending(c *conn) time.Duration {
	n := h.n
	now := time.Now()
	next := time.Hour
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch, at := range c.sent {
		if _, ok := h.confirmed[ch]; ok {
			continue
		}
		if due := at.Add(n.reroute).Sub(now); due > 0 {
			next = min(next, due)
			continue
		}
		delete(c.sent, ch)
		if n.nodes {
			n.rerouteLocked(ch, "") // unsubscribed by the next sync if it moved
		}
		next = 0
	}
	return next
}

func isUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	// PUBSUB SHARDNUMSUB before Redis 7: "ERR Unknown subcommand ..."
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}
