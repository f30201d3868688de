package redlock

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/store"
)

// A line is a waiting Acquire's place in the line of the quorum's first
// node ("How Redlock works" in GUARANTEES.md says why and how). Its id is
// its Locker's line tag, a dot, and its first attempt's token; the
// scripts keep its entry (redlock_grant.lua) and name it when its turn
// comes ("next <id>" on the turn channel, redlock_release.lua). An entry
// nobody keeps alive expires after LineEntryTTL.
type line struct {
	id    string
	in    atomic.Bool // the Acquire's last attempt found the lock held on the line's node, which kept its entry
	first atomic.Bool // and found no one ahead of it there
	named atomic.Bool // a release named it since (set by the notifier)

	q       *Quorum
	key     string
	widened bool // only the Acquire's goroutine uses it
}

// A lineSeat is the hearer of an Acquire in a line (home: on the line's
// node). In line, it hears only its turn, a release on the line's node,
// or a confirmation when no one was ahead of it (a release before it named
// one of those); woken, it is out of line until its next attempt.
type lineSeat struct {
	ln   *line
	home bool
}

func (s lineSeat) Hear(m notify.Message) notify.Hearing {
	ln := s.ln
	var named string
	if m.Head == "next" {
		named = m.Rest
	}
	if ln.in.Load() {
		switch {
		case named != "" && named != ln.id:
			return notify.Ignore // another's turn
		case m.Payload == "released" && !s.home:
			return notify.Ignore // the line's node names who is next
		case m.Payload == "" && !ln.first.Load():
			return notify.Ignore
		}
		ln.in.Store(false)
	}
	if named == ln.id {
		ln.named.Store(true)
	}
	return notify.WakeAll
}

func (s lineSeat) Lingers() bool { return s.home }

// widen registers w, the Acquire's waiter on the line's node, on the
// other nodes too, once: the Acquire is out of line, and any node's
// release may be the one it needs.
func (ln *line) widen(w *notify.Waiter) {
	if ln.widened {
		return
	}
	ln.widened = true
	for _, d := range ln.q.nodes[1:] {
		w.Join(d.Notifier(), d.Channel(ln.key), lineSeat{ln: ln})
	}
}

// LineEntryTTL is how long a line entry lives after its Acquire's last
// attempt: long enough for the pause of an Acquire in line (at most
// maxBackoff, Options.MaxRetryBackoff) and the attempt that follows it.
func LineEntryTTL(maxBackoff time.Duration) time.Duration {
	return max(time.Second, 4*maxBackoff)
}

// registerLine adds the waiter of an Acquire in line on the line's node
// only (its releases name who is next; the others' would wake it in vain),
// on the lock's channel and on this Locker's turn channel, until
// line.widen adds the others.
func (q *Quorum) registerLine(key string, ln *line) *notify.Waiter {
	home := q.nodes[0]
	ln.q, ln.key = q, key
	w := home.Listen(key, nil, lineSeat{ln: ln, home: true})
	if w != nil {
		w.Join(home.Notifier(), q.turnChannel(key), lineSeat{ln: ln, home: true})
	}
	return w
}

// register adds a waiter on every node. A call out of line when it
// registers also hears this Locker's turn channel on the line's node: its
// later attempts may join the line there, and be named.
func (q *Quorum) register(key string, h notify.Hearer) *notify.Waiter {
	var first *notify.Waiter
	for _, d := range q.nodes {
		if first != nil {
			first.Join(d.Notifier(), d.Channel(key), h)
		} else {
			first = d.Listen(key, nil, h) // nil once closed
		}
	}
	if first != nil {
		first.Join(q.nodes[0].Notifier(), q.turnChannel(key), h)
	}
	return first
}

// turnChannel is the channel on which the first node's releases name this
// Locker's calls in the line of the lock at key ("next <id>",
// redlock_release.lua): the lock's channel plus ":n:" and the Locker's line
// tag, the part of the call's id before the dot. Only the named call's
// Locker hears it.
func (q *Quorum) turnChannel(key string) string {
	return q.nodes[0].Channel(key) + ":n:" + q.cfg.LineTag
}

// wakeSpread is how long waiters woken by one release spread their next
// attempts over: at once, they would split the nodes' votes among them
// and none would get a quorum. Twice the time a quorum took to answer
// lately lets the first attempt's grants reach the nodes before most of
// the others start; it is capped by half MinRetryBackoff.
func (q *Quorum) wakeSpread() time.Duration {
	return min(2*time.Duration(q.answerTime.Load()), q.cfg.MinRetryBackoff/2)
}

// lineWakeup is the Wakeup of a waiting Acquire on the quorum: woken by
// its turn while in line, by every node's releases when not.
type lineWakeup struct {
	q    *Quorum
	key  string
	call *call
	w    *notify.Waiter
	ln   *line // nil when w was registered out of line
}

// Wakeup gives the lease's Acquire its id in the line.
func (k *lease) Wakeup() store.Wakeup {
	k.call.line = k.q.cfg.LineTag + "." + k.token
	return &lineWakeup{q: k.q, key: k.Key(), call: k.call}
}

func (lw *lineWakeup) Next(_ store.Attempt, _ bool, d time.Duration) (<-chan struct{}, time.Duration) {
	c := lw.call
	if lw.w == nil {
		if c.lined { // the first node found the lock busy: the call waits to be named there
			lw.ln = &line{id: c.line}
			lw.ln.in.Store(true) // before its subscription's confirmation
			lw.ln.first.Store(c.ahead == 0)
			lw.w = lw.q.registerLine(lw.key, lw.ln)
		} else {
			lw.w = lw.q.register(lw.key, notify.EveryMessage{}) // nil after Close, which the wait hears
		}
	}
	if lw.w == nil {
		return nil, d
	}
	lined := c.lined && lw.ln != nil
	if ln := lw.ln; ln != nil {
		ln.in.Store(lined)
		ln.first.Store(lined && c.ahead == 0)
		if !lined {
			ln.widen(lw.w)
		}
	}
	if lined {
		// A release names the next in line; this pause is for a message
		// lost, or one naming an Acquire that is gone.
		m := lw.q.cfg.MaxRetryBackoff
		d = m/2 + rand.N(m/2+1)
	}
	return lw.w.C(), d
}

func (lw *lineWakeup) Woken() time.Duration {
	if lw.ln != nil && lw.ln.named.Swap(false) {
		return 0 // woken by name: alone
	}
	return rand.N(lw.q.wakeSpread() + 1)
}

// Leave also takes a call that gives up out of the line, in the
// background, so that releases stop naming it, and retires its last token
// there, so that an attempt still on its way does not put it back. It
// tries once: an entry left behind expires by itself.
func (lw *lineWakeup) Leave(gaveUp store.Lease, _ bool) {
	if lw.w != nil {
		lw.w.Leave()
	}
	if gaveUp == nil { // it took the lock, or gave up holding it
		return
	}
	k, q := lw.call.last, lw.q
	q.cfg.Tasks.Go(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(context.Background(), q.cfg.ReleaseTimeout)
		defer cancel()
		_, _, _ = k.releaseNode(ctx, q.nodes[0], store.Abandon, k.spec.TTL, k.call.line)
	})
}
