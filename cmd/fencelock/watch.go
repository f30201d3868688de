package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/store"
	"github.com/redis/go-redis/v9"
)

var watchCommand = &command{
	name:     "watch",
	synopsis: "[flags] NAME",
	list:     "NAME",
	short:    "every grant, release and expiry, of permits too, as it happens",
	help: `Prints every change of the lock NAME, and of the semaphore and the
read-write lock of the name, as it happens, one line each, until
interrupted (SIGINT, SIGTERM: exit 0) or for --for. The lock's:

	held      the state when watch started: held, with fence, owner, TTL
	free      the state when watch started: free, with the last fence
	grant     a holder took the free lock
	hand-off  a holder took the lock within 300ms of a release (a waiter,
	          woken by the release or retrying within its backoff)
	release   the holder released the lock ("forced": release --force
	          deleted it)
	expiry    the lock's TTL ran out: its holder neither renewed nor
	          released it

A semaphore's permits and a read-write lock's holders, one line per
holder, with kind=semaphore and permits=HELD/PERMITS after the event, or
kind=rwlock and mode=shared or exclusive:

	holding   the state when watch started: a holder, with fence, owner,
	          TTL (and a permit's token)
	taken     a holder took a permit, or the read-write lock
	freed     the holder gave it back ("forced": release --force --permit
	          freed it)
	expired   its TTL ran out

It subscribes to their wake-up channels (SSUBSCRIBE, or SUBSCRIBE before
Redis 7) to see releases as they happen, and reads them (Locker.Inspect,
Semaphore.Inspect, RWLock.Inspect) every --interval to see grants,
hand-offs and expiries. A holding is known by its fence, a permit by its
token. A holding granted and gone between two reads is reported from the
fence counter ("unseen"), unless another holder has taken the lock by the
next read; a shorter --interval narrows that window. A running watch
counts as one waiter in inspect and ls.

Lines look like
	15:04:05.123 grant fence=1764525481123456 owner="pod-2 (pid 7)" ttl=30s
	15:04:06.210 freed kind=semaphore permits=2/3 fence=1764525480992317 owner="pod-1" token=9a1e...
and with --json each is a JSON object on a line of its own:
	{"time", "event", "name", "fence", "owner", "kind"}, with "ttl_ms"
	(held, grant, hand-off, holding, taken), "last_fence" (free),
	"from_fence" (hand-off), "forced" (release, freed), "unseen" (grant,
	release, taken, freed), "token", "permits_held" and "permits" (a
	semaphore's) and "mode" (a read-write lock's) where they apply.

Flags:

	--json             JSON lines.
	--interval D       how often to read them (default 50ms).
	--for D            stop after D and exit 0 (default: until interrupted).
`,
}

func init() { watchCommand.run = runWatch }

const (
	defaultInterval = 50 * time.Millisecond
	// handoffWindow: waiters wake at a release and retry within a round
	// trip, or within their backoff (at most 256ms by default) when the
	// wake-up was missed.
	handoffWindow = 300 * time.Millisecond
	// messageGrace is how long a holding read gone waits for a release
	// message still on its way before it is called an expiry.
	messageGrace = 100 * time.Millisecond
)

type eventJSON struct {
	Time      string `json:"time"`
	Event     string `json:"event"`
	Name      string `json:"name"`
	Fence     int64  `json:"fence"`
	Owner     string `json:"owner"`
	TTLMillis *int64 `json:"ttl_ms,omitempty"`
	LastFence *int64 `json:"last_fence,omitempty"`
	FromFence int64  `json:"from_fence,omitempty"`
	Forced    bool   `json:"forced,omitempty"`
	Unseen    bool   `json:"unseen,omitempty"`
	// What the event is of: "lock", "semaphore" (with "token",
	// "permits_held" and "permits") or "rwlock" (with "mode").
	Kind        string `json:"kind"`
	Token       string `json:"token,omitempty"`
	PermitsHeld *int   `json:"permits_held,omitempty"`
	Permits     *int   `json:"permits,omitempty"`
	Mode        string `json:"mode,omitempty"`
}

func runWatch(ctx context.Context, e *env, args []string) error {
	var cf connFlags
	fs := newFlagSet("watch", &cf)
	asJSON := fs.Bool("json", false, "")
	interval := fs.Duration("interval", defaultInterval, "")
	forD := fs.Duration("for", 0, "")
	pos, err := parse(e, watchCommand, fs, args)
	if err != nil {
		return err
	}
	name, err := oneName(watchCommand, pos)
	if err != nil {
		return err
	}
	if *interval < time.Millisecond {
		return usagef("watch: --interval %v is shorter than 1ms", *interval)
	}
	if *forD < 0 {
		return usagef("watch: --for %v is negative", *forD)
	}
	s, err := cf.open(e, "watch", nil)
	if err != nil {
		return err
	}
	defer s.close()

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *forD > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *forD)
		defer cancel()
	}
	f := newFollower(s, name)
	l := listen(ctx, s.client, f.channels(), func(msg string) { e.warn("watch: %s", msg) })
	defer l.stop()
	select { // the first read after the subscription: no release in between is missed
	case <-l.ready:
	case <-ctx.Done():
		return nil
	}
	w := &watching{e: e, cf: &cf, name: name, asJSON: *asJSON, interval: *interval, f: f}
	return w.run(ctx, l)
}

// watching is one run of watch: it reads on every message and every
// interval, and prints the events.
type watching struct {
	e        *env
	cf       *connFlags
	name     string
	asJSON   bool
	interval time.Duration
	f        *follower
	failing  bool // the last read failed; reported once
}

// run reads until ctx ends: at once, then on every batch of messages and
// every interval (sooner while a vanished holder waits for its message).
func (w *watching) run(ctx context.Context, l *listener) error {
	if err := w.read(ctx); err != nil {
		return err
	}
	timer := time.NewTimer(w.interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-l.msgs:
			w.f.message(m)
			for more := true; more; { // the messages that came together, then one read
				select {
				case m := <-l.msgs:
					w.f.message(m)
				default:
					more = false
				}
			}
		case <-timer.C:
		}
		if err := w.read(ctx); err != nil {
			return err
		}
		next := w.interval
		if w.f.waiting() {
			next = min(next, messageGrace)
		}
		timer.Reset(next)
	}
}

// read reads once and prints the events. A failure before the first read
// ends watch; later ones are reported once and retried.
func (w *watching) read(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, w.cf.timeout)
	defer cancel()
	events, err := w.f.read(rctx)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // stopping
	case err != nil && !w.f.started():
		return redisError("watch", w.cf, err)
	case err != nil:
		if !w.failing {
			w.failing = true
			w.e.warn("watch: %s; trying again every %v", trimPrefix(err), w.interval)
		}
		return nil
	case w.failing:
		w.failing = false
		w.e.warn("watch: Redis answers again")
	}
	for _, ev := range events {
		if w.asJSON {
			b, _ := json.Marshal(eventToJSON(w.name, ev))
			fmt.Fprintf(w.e.stdout, "%s\n", b)
			continue
		}
		fmt.Fprintln(w.e.stdout, formatEvent(ev))
	}
	return nil
}

// A follower reads the lock, the semaphore and the read-write lock of one
// name for watch, and turns the reads and the messages of their wake-up
// channels into events.
type follower struct {
	s       *session
	name    string
	lock    *tracker
	sem, rw *holdersTracker
}

func newFollower(s *session, name string) *follower {
	return &follower{s: s, name: name,
		lock: &tracker{handoff: handoffWindow, grace: messageGrace},
		sem:  newHoldersTracker(kindSemaphore, messageGrace),
		rw:   newHoldersTracker(kindRWLock, messageGrace)}
}

// channels returns the wake-up channels of the lock, the semaphore and
// the read-write lock: one hash tag, so one node of a Cluster has them all.
func (f *follower) channels() []string {
	key := f.s.key(f.name)
	return []string{f.s.channel(key), f.s.channel(key + semSuffix), f.s.channel(f.s.rwKey(f.name))}
}

// message hands a wake-up message to the tracker of its channel.
func (f *follower) message(m message) {
	switch ch := f.channels(); m.channel {
	case ch[0]:
		f.lock.message(m.forced)
	case ch[1]:
		f.sem.message(m.forced)
	case ch[2]:
		f.rw.message(m.forced)
	}
}

func (f *follower) started() bool { return f.lock.started }

// waiting reports whether a tracker waits for a late message.
func (f *follower) waiting() bool { return f.lock.waiting() || f.sem.waiting() || f.rw.waiting() }

// read reads the three and returns the events they reveal: the lock's,
// then the semaphore's, then the read-write lock's. Nothing is observed
// unless all three reads succeed. The first read leads with what the name
// is: it omits "free" when the semaphore or the read-write lock is held.
func (f *follower) read(ctx context.Context) ([]event, error) {
	start := time.Now()
	info, err := f.s.locker.Inspect(ctx, f.name)
	if err != nil {
		return nil, err
	}
	end := time.Now()
	sem, err := f.s.inspectSemaphore(ctx, f.name)
	if err != nil {
		return nil, err
	}
	semEnd := time.Now()
	rw, err := f.s.inspectRW(ctx, f.name)
	if err != nil {
		return nil, err
	}
	rwEnd := time.Now()
	first := !f.lock.started
	events := f.lock.observe(start, end, info)
	others := append(f.sem.observe(end, semEnd, semRead(sem)), f.rw.observe(semEnd, rwEnd, rwRead(rw))...)
	if first && len(others) > 0 && !info.Held {
		events = nil // not "free": the name is a semaphore's or a read-write lock's
	}
	return append(events, others...), nil
}

// formatEvent formats ev as a line for people, in logfmt.
func formatEvent(ev event) string {
	if ev.Of != "" {
		return formatHolderEvent(ev)
	}
	line := ev.At.Format("15:04:05.000") + " " + ev.Kind
	switch ev.Kind {
	case evFree:
		if ev.LastFence != 0 {
			line += " last_fence=" + strconv.FormatInt(ev.LastFence, 10)
		}
		return line
	}
	line += " fence=" + strconv.FormatInt(ev.Fence, 10)
	if !ev.Unseen || ev.Owner != "" {
		line += " owner=" + strconv.Quote(ev.Owner)
	}
	switch ev.Kind {
	case evHeld, evGrant, evHandoff:
		if !ev.Unseen {
			line += " ttl=" + fmtTTL(ev.TTL)
		}
	}
	if ev.Kind == evHandoff {
		line += " from_fence=" + strconv.FormatInt(ev.From, 10)
	}
	if ev.Forced {
		line += " forced"
	}
	if ev.Unseen {
		line += " unseen"
	}
	return line
}

// formatHolderEvent formats the event of a semaphore's permit or a
// read-write lock's holder, in logfmt.
func formatHolderEvent(ev event) string {
	line := ev.At.Format("15:04:05.000") + " " + ev.Kind + " kind=" + ev.Of
	if ev.Of == kindSemaphore {
		line += fmt.Sprintf(" permits=%d/%d", ev.Held, ev.Permits)
	} else if ev.Mode != "" {
		line += " mode=" + ev.Mode
	}
	line += " fence=" + strconv.FormatInt(ev.Fence, 10)
	if !ev.Unseen || ev.Owner != "" {
		line += " owner=" + strconv.Quote(ev.Owner)
	}
	if (ev.Kind == evHolding || ev.Kind == evTaken) && !ev.Unseen {
		line += " ttl=" + fmtTTL(ev.TTL)
	}
	if ev.Token != "" {
		line += " token=" + ev.Token
	}
	if ev.Forced {
		line += " forced"
	}
	if ev.Unseen {
		line += " unseen"
	}
	return line
}

func eventToJSON(name string, ev event) eventJSON {
	j := eventJSON{Time: ev.At.Format(time.RFC3339Nano), Event: ev.Kind, Name: name, Fence: ev.Fence, Owner: ev.Owner,
		FromFence: ev.From, Forced: ev.Forced, Unseen: ev.Unseen, Kind: kindLock}
	if ev.Of != "" {
		j.Kind, j.Token, j.Mode = ev.Of, ev.Token, ev.Mode
		if ev.Of == kindSemaphore {
			j.PermitsHeld, j.Permits = &ev.Held, &ev.Permits
		}
	}
	switch ev.Kind {
	case evHeld, evGrant, evHandoff, evHolding, evTaken:
		if !ev.Unseen {
			ms := ttlMillis(ev.TTL)
			j.TTLMillis = &ms
		}
	case evFree:
		j.LastFence = &ev.LastFence
	}
	return j
}

// A listener is the subscription to a lock's wake-up channel, and the
// goroutine that owns it: it sends each release message's forced flag on
// msgs, and subscribes again when the connection breaks or the server
// ends the subscription (a Cluster slot moved). stop ends it and waits for
// it.
type listener struct {
	client   redis.UniversalClient
	channels []string // one hash tag: one node of a Cluster has them all
	warn     func(string)
	msgs     chan message
	ready    chan struct{} // closed after the first subscription, made or refused
	cancel   context.CancelFunc
	done     chan struct{} // closed when run returns

	mu      sync.Mutex
	ps      *redis.PubSub // guarded by mu; nil between subscriptions
	stopped bool          // guarded by mu
}

// message is one message of a wake-up channel.
type message struct {
	channel string
	forced  bool // "forced": release --force
}

func listen(ctx context.Context, client redis.UniversalClient, channels []string, warn func(string)) *listener {
	l := &listener{client: client, channels: channels, warn: warn,
		msgs: make(chan message, 64), ready: make(chan struct{}), done: make(chan struct{})}
	ctx, l.cancel = context.WithCancel(ctx)
	go func() {
		defer close(l.done)
		l.run(ctx)
	}()
	return l
}

func (l *listener) stop() {
	l.cancel()
	l.mu.Lock()
	l.stopped = true
	if l.ps != nil {
		_ = l.ps.Close() // ends a Receive in progress
	}
	l.mu.Unlock()
	<-l.done
}

// set makes ps the current subscription; false once stopped.
func (l *listener) set(ps *redis.PubSub) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.ps = ps
	return true
}

func (l *listener) run(ctx context.Context) {
	readyOnce := sync.OnceFunc(func() { close(l.ready) })
	defer readyOnce()
	sharded := true
	pause := 50 * time.Millisecond
	for ctx.Err() == nil {
		ps, err := l.subscribe(ctx, &sharded)
		if err != nil {
			ps.Close()
			if refused(err) {
				// An ACL without the channel, say: there is nothing to
				// wait for; the reads still see every change.
				l.warn(fmt.Sprintf("cannot subscribe to %s (%s): releases are seen by reading every --interval only", strings.Join(l.channels, ", "), oneLine(err.Error())))
				return
			}
			readyOnce() // unreachable: the first read reports it
			if !sleep(ctx, pause) {
				return
			}
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 50 * time.Millisecond
		if !l.set(ps) {
			ps.Close()
			return
		}
		readyOnce()
		l.receive(ctx, ps)
		l.set(nil)
		_ = ps.Close()
	}
}

// subscribe subscribes to the channel, sharded where the server has it,
// and waits for the confirmation.
func (l *listener) subscribe(ctx context.Context, sharded *bool) (*redis.PubSub, error) {
	for {
		var ps *redis.PubSub
		if *sharded {
			ps = l.client.SSubscribe(ctx, l.channels...)
		} else {
			ps = l.client.Subscribe(ctx, l.channels...)
		}
		_, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil && *sharded && store.IsUnknownCommand(err) {
			_ = ps.Close()
			*sharded = false
			continue
		}
		return ps, err
	}
}

// receive forwards messages until the subscription ends.
func (l *listener) receive(ctx context.Context, ps *redis.PubSub) {
	for {
		m, err := ps.Receive(ctx)
		if err != nil {
			// go-redis reconnects and subscribes again on the next
			// Receive; a release meanwhile is seen by the reads.
			if ctx.Err() != nil || !sleep(ctx, 50*time.Millisecond) {
				return
			}
			l.mu.Lock()
			stopped := l.stopped
			l.mu.Unlock()
			if stopped {
				return
			}
			continue
		}
		switch m := m.(type) {
		case *redis.Message:
			select {
			case l.msgs <- message{channel: m.Channel, forced: m.Payload == "forced"}:
			case <-ctx.Done():
				return
			}
		case *redis.Subscription:
			if m.Kind == "sunsubscribe" || m.Kind == "unsubscribe" {
				return // the server ended it: subscribe where the channel is now
			}
		}
	}
}

// refused reports an error of a Redis that answered and will not let us
// subscribe; not a transient state, nor a redirection after a Cluster slot
// moved (go-redis reloads the slot map when the reads meet it).
func refused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	code, _, _ := strings.Cut(err.Error(), " ")
	switch code {
	case "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN", "BUSY":
		return false
	}
	return true
}

// sleep waits for d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
