package redlock

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/store"
)

// A line is a waiting Acquire's place in the line of the quorum's first node
// ("How Redlock works"). Its id is the Locker's line tag, a dot, and its
// first token; releases name it ("next <id>") on the turn channel.
type line struct {
	id    string
	in    atomic.Bool // the Acquire's last attempt found the lock held on the line's node, which kept its entry
	first atomic.Bool // and found no one ahead of it there
	named atomic.Bool // a release named it since (set by the notifier)
}

// A lineSeat is the hearer of an Acquire in a line (home: on the line's
// node). In line, it hears only its turn, a release on the line's node, or
// a confirmation when no one was ahead; woken, it is out of line.
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

// widen registers the waiter, out of line now, on the other nodes too, once.
func (lw *lineWakeup) widen() {
	if lw.widened {
		return
	}
	lw.widened = true
	for _, d := range lw.q.nodes[1:] {
		lw.w.Join(d.Notifier(), d.Channel(lw.key), lineSeat{ln: lw.ln})
	}
}

// LineEntryTTL is how long a line entry lives after its Acquire's last
// attempt: the longest pause in line (maxBackoff) and the next attempt.
func LineEntryTTL(maxBackoff time.Duration) time.Duration {
	return max(time.Second, 4*maxBackoff)
}

// register adds a waiter on the lock's channel of the first node, with all
// of every node (an Acquire in line hears the line's node only, until
// line.widen), and on this Locker's turn channel there: a call may be named.
func (q *Quorum) register(key string, h notify.Hearer, all bool) *notify.Waiter {
	nodes := q.nodes[:1]
	if all {
		nodes = q.nodes
	}
	var w *notify.Waiter
	for _, d := range nodes {
		if w != nil {
			w.Join(d.Notifier(), d.Channel(key), h)
		} else {
			w = d.Listen(key, nil, h) // nil once closed
		}
	}
	if w != nil {
		w.Join(q.nodes[0].Notifier(), q.turnChannel(key), h)
	}
	return w
}

// turnChannel is the channel on which the first node's releases name this
// Locker's calls in the line of the lock at key: the lock's channel, ":n:"
// and the line tag.
func (q *Quorum) turnChannel(key string) string {
	return q.nodes[0].Channel(key) + ":n:" + q.cfg.LineTag
}

// wakeSpread is how long waiters woken by one release spread their next
// attempts over, lest they split the nodes' votes: twice the time a quorum
// took to answer lately, at most half MinRetryBackoff.
func (q *Quorum) wakeSpread() time.Duration {
	return min(2*time.Duration(q.answerTime.Load()), q.cfg.MinRetryBackoff/2)
}

// lineWakeup is the Wakeup of a waiting Acquire on the quorum: woken by
// its turn while in line, by every node's releases when not.
type lineWakeup struct {
	q       *Quorum
	key     string
	call    *call
	w       *notify.Waiter
	ln      *line // nil when w was registered out of line
	widened bool  // w hears every node
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
			lw.w = lw.q.register(lw.key, lineSeat{ln: lw.ln, home: true}, false)
		} else {
			lw.w = lw.q.register(lw.key, notify.EveryMessage{}, true) // nil after Close, which the wait hears
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
			lw.widen()
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

// Leave also takes a call that gives up out of the line in the background,
// trying once (an entry left behind expires), and retires its last token.
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
