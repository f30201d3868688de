package fencelock

import (
	"context"
	mathrand "math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
)

// A line is a waiting Acquire's place in the line of a Redlock quorum's
// first node ("How Redlock works" in GUARANTEES.md says why and how). Its
// id is its Locker's line tag, a dot, and its first attempt's token; the
// scripts keep its entry (redlock_grant.lua) and name it when its turn comes
// ("next <id>" on turnChannel, redlock_release.lua). An entry nobody keeps
// alive expires after lineEntryTTL.
type line struct {
	id    string
	in    atomic.Bool // the Acquire's last attempt found the lock held on the line's node, which kept its entry
	first atomic.Bool // and found no one ahead of it there
	named atomic.Bool // a release named it since (set by the notifier)

	// Set by quorum.registerLine, for widen; only the Acquire's goroutine
	// uses them.
	q       *quorum
	key     string
	widened bool
}

// A lineSeat is the hearer of an Acquire in a line (home: on the line's
// node). In line, it hears only its turn, a release on the line's node, or
// a confirmation when no one was ahead of it (a release before it named one
// of those); woken, it is out of line until its next attempt.
type lineSeat struct {
	ln   *line
	home bool
}

func (s lineSeat) hear(_ *waiter, m message) hearing {
	ln := s.ln
	var named string
	if m.head == "next" {
		named = m.rest
	}
	if ln.in.Load() {
		switch {
		case named != "" && named != ln.id:
			return ignore // another's turn
		case m.payload == "released" && !s.home:
			return ignore // the line's node names who is next
		case m.payload == "" && !ln.first.Load():
			return ignore
		}
		ln.in.Store(false)
	}
	if named == ln.id {
		ln.named.Store(true)
	}
	return wakeAll
}

func (s lineSeat) lingers(*waiter) bool { return s.home }

// widen registers w, the Acquire's waiter on the line's node, on the other
// nodes too, once: the Acquire is out of line, and any node's release may
// be the one it needs.
func (ln *line) widen(w *waiter) {
	if ln.widened {
		return
	}
	ln.widened = true
	for _, d := range ln.q.nodes[1:] {
		w.join(d.waits, d.channel(ln.key), lineSeat{ln: ln})
	}
}

// lineEntryTTL is how long a line entry lives after its Acquire's last
// attempt: long enough for the pause of an Acquire in line (at most
// maxBackoff, Options.MaxRetryBackoff) and the attempt that follows it.
func lineEntryTTL(maxBackoff time.Duration) time.Duration {
	return max(time.Second, 4*maxBackoff)
}

// registerLine adds the waiter of an Acquire in line on the line's node
// only (its releases name who is next; the others' would wake it in vain),
// on the lock's channel and on this Locker's turn channel, until line.widen
// adds the others.
func (q *quorum) registerLine(key string, ln *line) *waiter {
	home := q.nodes[0]
	ln.q, ln.key = q, key
	w := home.waits.register(home.channel(key), nil, lineSeat{ln: ln, home: true})
	if w != nil {
		w.join(home.waits, q.turnChannel(key), lineSeat{ln: ln, home: true})
	}
	return w
}

// register adds a waiter on every node. A call out of line when it
// registers also hears this Locker's turn channel on the line's node: its
// later attempts may join the line there, and be named.
func (q *quorum) register(key string, h hearer) *waiter {
	var first *waiter
	for _, d := range q.nodes {
		if first != nil {
			first.join(d.waits, d.channel(key), h)
		} else {
			first = d.waits.register(d.channel(key), nil, h) // nil once closed
		}
	}
	if first != nil {
		first.join(q.nodes[0].waits, q.turnChannel(key), h)
	}
	return first
}

// turnChannel is the channel on which the first node's releases name this
// Locker's calls in the line of the lock at key ("next <id>", redlock_release.lua):
// the lock's channel plus ":n:" and the Locker's line tag, the part of the
// call's id before the dot. Only the named call's Locker hears it.
func (q *quorum) turnChannel(key string) string {
	return q.nodes[0].channel(key) + ":n:" + q.l.lineTag
}

// wakeSpread is how long waiters woken by one release spread their next
// attempts over: at once, they would split the nodes' votes among them and
// none would get a quorum. Twice the time a quorum took to answer lately
// lets the first attempt's grants reach the nodes before most of the
// others start; it is capped by half MinRetryBackoff.
func (q *quorum) wakeSpread() time.Duration {
	return min(2*time.Duration(q.answerTime.Load()), q.l.opts.MinRetryBackoff/2)
}

// lineWakeup is the wakeup (acquire.go) of a waiting Acquire on a Redlock:
// woken by its turn while in line, by every node's releases when not.
type lineWakeup struct {
	q   *quorum
	key string
	id  string // the call's id in the line
	w   *waiter
	ln  *line // nil when w was registered out of line
}

// wakeup gives lease's Acquire its id in the line.
func (q *quorum) wakeup(lease *Lease) *lineWakeup {
	lease.line = q.l.lineTag + "." + lease.token
	return &lineWakeup{q: q, key: lease.keys[keys.LockKey], id: lease.line}
}

func (lw *lineWakeup) next(at attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if lw.w == nil {
		if at.lined { // the first node found the lock busy: the call waits to be named there
			lw.ln = &line{id: lw.id}
			lw.ln.in.Store(true) // before its subscription's confirmation
			lw.ln.first.Store(at.ahead == 0)
			lw.w = lw.q.registerLine(lw.key, lw.ln)
		} else {
			lw.w = lw.q.register(lw.key, everyMessage{}) // nil after Close, which the wait hears
		}
	}
	if lw.w == nil {
		return nil, d
	}
	lined := at.lined && lw.ln != nil
	if ln := lw.ln; ln != nil {
		ln.in.Store(lined)
		ln.first.Store(lined && at.ahead == 0)
		if !lined {
			ln.widen(lw.w)
		}
	}
	if lined {
		// A release names the next in line; this pause is for a message
		// lost, or one naming an Acquire that is gone.
		m := lw.q.l.opts.MaxRetryBackoff
		d = m/2 + mathrand.N(m/2+1)
	}
	return lw.w.wake, d
}

func (lw *lineWakeup) woken() time.Duration {
	if lw.ln != nil && lw.ln.named.Swap(false) {
		return 0 // woken by name: alone
	}
	return mathrand.N(lw.q.wakeSpread() + 1)
}

// leave also takes a call that gives up out of the line, in the background,
// so that releases stop naming it, and retires its last token there, so
// that an attempt still on its way does not put it back. It tries once: an
// entry left behind expires by itself.
func (lw *lineWakeup) leave(gaveUp *Lease, _ bool) {
	if lw.w != nil {
		lw.w.leave()
	}
	if gaveUp == nil {
		return
	}
	l := lw.q.l
	l.bg.Go(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(context.Background(), l.opts.ReleaseTimeout)
		defer cancel()
		_, _, _ = lw.q.nodes[0].releaseNode(ctx, gaveUp, modeAbandon, gaveUp.line)
	})
}
