package main

import (
	"time"

	"github.com/fencelock/fencelock"
)

// Event kinds that watch reports.
const (
	evHeld    = "held"     // the state when watch started: held
	evFree    = "free"     // the state when watch started: free
	evGrant   = "grant"    // a holder took the free lock
	evHandoff = "hand-off" // a holder took the lock right after a release
	evRelease = "release"  // the holder deleted the lock (or release --force did)
	evExpiry  = "expiry"   // the lock's TTL ran out
)

// An event is one change of a lock's holding.
type event struct {
	Kind      string
	At        time.Time
	Fence     int64
	Owner     string
	TTL       time.Duration // held, grant, hand-off: as read; -1: no expiry
	LastFence int64         // free: the last fence issued
	From      int64         // hand-off: the fence of the holding released before
	Forced    bool          // release: by fencelock release --force
	Unseen    bool          // grant, release, taken, freed: a holding granted and gone between two reads

	// A semaphore's permit or a read-write lock's holder (holding, taken,
	// freed, expired); "" for the lock's events.
	Of      string // kindSemaphore or kindRWLock
	Token   string // a permit's
	Mode    string // a read-write lock's holder's: shared or exclusive
	Held    int    // a semaphore's permits held after the event
	Permits int    // a semaphore's permits, as its holders last used them
}

// A tracker turns reads of a lock (Locker.Inspect) and the release
// messages of its wake-up channel into events. It is not safe for
// concurrent use; its times are passed in, so that it is tested without
// Redis or sleeps.
//
// A holding is told apart by its fence, which is new with every grant. A
// holding that disappears is a release when a release message came since
// the previous read, or when it disappeared before its TTL could have run
// out; an expiry otherwise. A message may be handled after the read that
// already shows the lock gone (the subscription and the reads use two
// connections), so a holding gone without a message waits up to grace
// for one before it is called an expiry.
type tracker struct {
	handoff time.Duration // a grant this soon after a release is a hand-off
	grace   time.Duration // how long a vanished holding waits for its release message

	started   bool
	cur       *holding // the holding last read; nil when free
	lastFence int64    // LastFence at the previous read
	msgs      []bool   // release messages since the previous read: forced or not
	vanished  time.Time
	relAt     time.Time // the last release, for hand-offs; zero once used
	relFence  int64
}

// holding is one holder's tenure of the lock, as read.
type holding struct {
	fence    int64
	owner    string
	deadline time.Time // the earliest its TTL could run out, as last read; zero: never, or unknown
}

// message records a release message on the lock's wake-up channel.
func (t *tracker) message(forced bool) { t.msgs = append(t.msgs, forced) }

// waiting reports whether a vanished holding waits for a late release
// message: the caller reads again within grace.
func (t *tracker) waiting() bool { return !t.vanished.IsZero() }

// observe takes a read that started at start and returned at end, and
// returns the events it reveals. Messages recorded before the read are
// accounted for by it.
func (t *tracker) observe(start, end time.Time, info fencelock.LockInfo) []event {
	defer func() { t.msgs = t.msgs[:0] }() // a message no holding explains is dropped
	if !t.started {
		t.started = true
		t.lastFence = info.LastFence
		if !info.Held {
			return []event{{Kind: evFree, At: end, LastFence: info.LastFence}}
		}
		t.cur = newHolding(start, info)
		return []event{{Kind: evHeld, At: end, Fence: info.Fence, Owner: info.Owner, TTL: info.TTL}}
	}
	var out []event
	if t.cur != nil && !(info.Held && info.Fence == t.cur.fence) {
		ev, decided := t.end(end)
		if !decided {
			return nil
		}
		out = append(out, ev)
	}
	// The fence counter moved to a fence that does not hold the lock: a
	// holding was granted and gone between the two reads.
	if info.LastFence != 0 && info.LastFence != t.lastFence && !(info.Held && info.Fence == info.LastFence) {
		// Its end is called a release: its TTL is unknown, and a holding
		// that short was more likely released than left to expire.
		g := &holding{fence: info.LastFence}
		out = append(out, t.grant(end, g, 0, true))
		ev := event{Kind: evRelease, At: end, Fence: g.fence, Unseen: true}
		if len(t.msgs) > 0 {
			ev.Forced = t.msgs[0]
			t.msgs = t.msgs[1:]
		}
		out = append(out, ev)
		t.cur, t.relAt, t.relFence = nil, end, g.fence
	}
	if info.Held {
		h := newHolding(start, info)
		if t.cur == nil {
			out = append(out, t.grant(end, h, info.TTL, false))
		}
		t.cur = h // a renewal moved its deadline
	}
	t.lastFence = info.LastFence
	return out
}

func newHolding(start time.Time, info fencelock.LockInfo) *holding {
	h := &holding{fence: info.Fence, owner: info.Owner}
	if info.TTL >= 0 { // 0 in its last millisecond; -1: no expiry
		// The server read the TTL after start: the lock lives at least
		// until start+TTL.
		h.deadline = start.Add(info.TTL)
	}
	return h
}

// grant makes h the current holding and returns its event: a hand-off
// when a release came just before.
func (t *tracker) grant(now time.Time, h *holding, ttl time.Duration, unseen bool) event {
	ev := event{Kind: evGrant, At: now, Fence: h.fence, Owner: h.owner, TTL: ttl, Unseen: unseen}
	if !t.relAt.IsZero() && now.Sub(t.relAt) <= t.handoff {
		ev.Kind, ev.From = evHandoff, t.relFence
	}
	t.relAt = time.Time{}
	t.cur = h
	return ev
}

// end decides how the current holding ended, read gone at now; false
// while it waits for a late release message.
func (t *tracker) end(now time.Time) (event, bool) {
	h := t.cur
	ev := event{Kind: evRelease, At: now, Fence: h.fence, Owner: h.owner}
	switch {
	case len(t.msgs) > 0:
		ev.Forced = t.msgs[0]
		t.msgs = t.msgs[1:]
	case t.vanished.IsZero() && t.grace > 0:
		t.vanished = now
		return event{}, false
	case now.Sub(t.vanished) < t.grace:
		return event{}, false
	default:
		gone := t.vanished
		if gone.IsZero() {
			gone = now
		}
		if !h.deadline.IsZero() && !gone.Before(h.deadline) {
			ev.Kind = evExpiry
		}
		// Otherwise it was deleted before its TTL could run out, without
		// a message: by hand, or by a holder not permitted to publish.
	}
	if ev.Kind == evRelease {
		t.relAt, t.relFence = now, h.fence
	}
	t.cur, t.vanished = nil, time.Time{}
	return ev, true
}
