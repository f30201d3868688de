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

	"github.com/redis/go-redis/v9"
)

var watchCommand = &command{
	name:     "watch",
	synopsis: "[flags] NAME",
	list:     "NAME",
	short:    "every grant, hand-off, release and expiry as it happens",
	help: `Prints every change of the lock NAME as it happens, one line each, until
interrupted (SIGINT, SIGTERM: exit 0) or for --for:

	held      the state when watch started: held, with fence, owner, TTL
	free      the state when watch started: free, with the last fence
	grant     a holder took the free lock
	hand-off  a holder took the lock within 300ms of a release (a waiter,
	          woken by the release or retrying within its backoff)
	release   the holder released the lock ("forced": release --force
	          deleted it)
	expiry    the lock's TTL ran out: its holder neither renewed nor
	          released it

It subscribes to the lock's wake-up channel (SSUBSCRIBE, or SUBSCRIBE
before Redis 7) to see releases as they happen, and reads the lock
(Locker.Inspect) every --interval to see grants, hand-offs and expiries.
A holding is known by its fence. A holding granted and gone between two
reads is reported from the fence counter ("unseen"), unless another holder
has taken the lock by the next read; a shorter --interval narrows that
window. A running watch counts as one waiter in inspect and ls.

Lines look like
	15:04:05.123 grant fence=1764525481123456 owner="pod-2 (pid 7)" ttl=30s
and with --json each is a JSON object on a line of its own:
	{"time", "event", "name", "fence", "owner"}, with "ttl_ms" (held,
	grant, hand-off), "last_fence" (free), "from_fence" (hand-off), "forced"
	(release) and "unseen" (grant, release) where they apply.

Flags:

	--json             JSON lines.
	--interval D       how often to read the lock (default 50ms).
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
	emit := func(ev event) {
		if *asJSON {
			b, _ := json.Marshal(eventToJSON(name, ev))
			fmt.Fprintf(e.stdout, "%s\n", b)
			return
		}
		fmt.Fprintln(e.stdout, formatEvent(ev))
	}

	channel := s.channel(s.key(name))
	l := listen(ctx, s.client, channel, func(msg string) { e.warn("watch: %s", msg) })
	defer l.stop()
	select { // the first read after the subscription: no release in between is missed
	case <-l.ready:
	case <-ctx.Done():
		return nil
	}

	tr := &tracker{handoff: handoffWindow, grace: messageGrace}
	failing := false
	read := func() error {
		rctx, cancel := context.WithTimeout(ctx, cf.timeout)
		defer cancel()
		start := time.Now()
		info, err := s.locker.Inspect(rctx, name)
		end := time.Now()
		switch {
		case err != nil && ctx.Err() != nil:
			return nil // stopping
		case err != nil && !tr.started:
			return redisError("watch", &cf, err)
		case err != nil:
			if !failing {
				failing = true
				e.warn("watch: %s; trying again every %v", trimPrefix(err), *interval)
			}
			return nil
		case failing:
			failing = false
			e.warn("watch: Redis answers again")
		}
		for _, ev := range tr.observe(start, end, info) {
			emit(ev)
		}
		return nil
	}
	if err := read(); err != nil {
		return err
	}
	timer := time.NewTimer(*interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case forced := <-l.msgs:
			tr.message(forced)
			for more := true; more; { // the messages that came together, then one read
				select {
				case forced := <-l.msgs:
					tr.message(forced)
				default:
					more = false
				}
			}
		case <-timer.C:
		}
		if err := read(); err != nil {
			return err
		}
		next := *interval
		if tr.waiting() {
			next = min(next, messageGrace)
		}
		timer.Reset(next)
	}
}

// formatEvent formats ev as a line for people, in logfmt.
func formatEvent(ev event) string {
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

func eventToJSON(name string, ev event) eventJSON {
	j := eventJSON{Time: ev.At.Format(time.RFC3339Nano), Event: ev.Kind, Name: name, Fence: ev.Fence, Owner: ev.Owner,
		FromFence: ev.From, Forced: ev.Forced, Unseen: ev.Unseen}
	switch ev.Kind {
	case evHeld, evGrant, evHandoff:
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
	client  redis.UniversalClient
	channel string
	warn    func(string)
	msgs    chan bool     // forced
	ready   chan struct{} // closed after the first subscription, made or refused
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns

	mu      sync.Mutex
	ps      *redis.PubSub // guarded by mu; nil between subscriptions
	stopped bool          // guarded by mu
}

func listen(ctx context.Context, client redis.UniversalClient, channel string, warn func(string)) *listener {
	l := &listener{client: client, channel: channel, warn: warn,
		msgs: make(chan bool, 64), ready: make(chan struct{}), done: make(chan struct{})}
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
				l.warn(fmt.Sprintf("cannot subscribe to %s (%s): releases are seen by reading every --interval only", l.channel, oneLine(err.Error())))
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
			ps = l.client.SSubscribe(ctx, l.channel)
		} else {
			ps = l.client.Subscribe(ctx, l.channel)
		}
		_, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil && *sharded && isUnknownCommand(err) {
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
			case l.msgs <- m.Payload == "forced":
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

// isUnknownCommand reports a server without sharded pub/sub (before
// Redis 7).
func isUnknownCommand(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(err.Error()), "unknown command")
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
