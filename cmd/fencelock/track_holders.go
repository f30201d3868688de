package main

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/fencelock/fencelock"
)

// Event kinds that watch reports for a semaphore's permits and a
// read-write lock's holders, one line per holder.
const (
	evHolding = "holding" // the state when watch started: a permit or a holder of the read-write lock
	evTaken   = "taken"   // a holder took a permit, or the read-write lock
	evFreed   = "freed"   // the holder gave it back (or release --force --permit freed it)
	evExpired = "expired" // its TTL ran out
)

// What a holders event is of: a semaphore's permit or a read-write lock's
// holder. A lock's events have kindLock.
const (
	kindLock      = "lock"
	kindSemaphore = "semaphore"
	kindRWLock    = "rwlock"
)

// A holdersRead is one read of a semaphore (Semaphore.Inspect) or a
// read-write lock (RWLock.Inspect): its holders, each known by its id.
type holdersRead struct {
	holders   []heldBy
	permits   int // a semaphore's, when it has holders; 0 otherwise
	lastFence int64
}

// heldBy is one holder as read.
type heldBy struct {
	id    string // a permit's token; a read-write lock's mode and fence
	fence int64
	owner string
	token string        // a permit's
	mode  string        // a read-write lock's: shared or exclusive
	ttl   time.Duration // -1: no expiry
}

func semRead(info fencelock.SemaphoreInfo) holdersRead {
	r := holdersRead{lastFence: info.LastFence}
	if len(info.Holders) > 0 {
		r.permits = info.Permits // the Semaphore's own (1) when none holds one
	}
	for _, h := range info.Holders {
		r.holders = append(r.holders, heldBy{id: h.Token, fence: h.Fence, owner: h.Owner, token: h.Token, ttl: h.TTL})
	}
	return r
}

func rwRead(info fencelock.RWLockInfo) holdersRead {
	r := holdersRead{lastFence: info.LastFence}
	rwHolders(info, func(mode string, h fencelock.RWHolder) {
		id := mode + " " + strconv.FormatInt(h.Fence, 10)
		r.holders = append(r.holders, heldBy{id: id, fence: h.Fence, owner: h.Owner, mode: mode, ttl: h.TTL})
	})
	return r
}

// A holdersTracker is tracker's counterpart for a name with several
// holders at once, a semaphore or a read-write lock: it turns reads and
// the messages of the wake-up channel into events, one per holder taken,
// freed or expired. It is not safe for concurrent use; its times are
// passed in.
//
// A holder is told apart by its id. One that disappears is freed when it
// disappeared before its TTL could have run out, expired otherwise. As in
// tracker, a holder gone without a message waits up to grace for one
// before it is decided: a "forced" message (release --force --permit)
// marks it freed by force. A semaphore publishes on a release only when
// someone waits, so most frees wait out the grace.
type holdersTracker struct {
	kind  string        // kindSemaphore or kindRWLock
	grace time.Duration // how long a vanished holder waits for a message

	started   bool
	cur       map[string]*heldAt // the holders last read, by id
	permits   int                // a semaphore's, as last read with holders
	lastFence int64
	msgs      []bool // messages since the previous read: forced or not
	vanished  time.Time
}

// heldAt is a holder as last read, with the earliest its TTL could run
// out (zero: never).
type heldAt struct {
	heldBy
	deadline time.Time
}

func newHoldersTracker(kind string, grace time.Duration) *holdersTracker {
	return &holdersTracker{kind: kind, grace: grace, cur: map[string]*heldAt{}}
}

// message records a message on the wake-up channel.
func (t *holdersTracker) message(forced bool) { t.msgs = append(t.msgs, forced) }

// waiting reports whether a vanished holder waits for a late message.
func (t *holdersTracker) waiting() bool { return !t.vanished.IsZero() }

// observe takes a read that started at start and returned at end, and
// returns the events it reveals, oldest fence first: the holders gone,
// then one granted and gone between two reads (from the fence counter,
// unseen), then the holders new.
func (t *holdersTracker) observe(start, end time.Time, r holdersRead) []event {
	defer func() { t.msgs = t.msgs[:0] }()
	if r.permits > 0 {
		t.permits = r.permits
	}
	if !t.started {
		return t.first(start, end, r)
	}
	now := map[string]heldBy{}
	for _, h := range r.holders {
		now[h.id] = h
	}
	var gone []*heldAt
	for id, h := range t.cur {
		if _, ok := now[id]; !ok {
			gone = append(gone, h)
		}
	}
	if len(gone) > 0 && len(t.msgs) == 0 {
		if t.vanished.IsZero() {
			t.vanished = end
		}
		if end.Sub(t.vanished) < t.grace {
			return nil // decided at a later read
		}
	}
	goneAt := t.vanished
	if goneAt.IsZero() {
		goneAt = end
	}
	t.vanished = time.Time{}
	slices.SortFunc(gone, func(a, b *heldAt) int { return cmp.Compare(a.fence, b.fence) })

	out := t.drop(end, goneAt, gone)
	held := len(t.cur)
	if r.lastFence != 0 && r.lastFence != t.lastFence && !t.knows(r.lastFence, now, gone) {
		// The fence counter moved to a fence nobody read: a holder was
		// granted and gone between the two reads; called freed, as
		// tracker calls such a holding released.
		h := heldBy{fence: r.lastFence}
		taken := t.event(evTaken, end, h, held+1)
		taken.Unseen = true
		freed := t.event(evFreed, end, h, held)
		freed.Unseen = true
		out = append(out, taken, freed)
	}
	var added []heldBy
	for _, h := range r.holders {
		if _, ok := t.cur[h.id]; !ok {
			added = append(added, h)
		}
		t.cur[h.id] = at(start, h) // a renewal moved its deadline
	}
	for _, h := range added { // r.holders' order: oldest fence first
		held++
		out = append(out, t.event(evTaken, end, h, held))
	}
	t.lastFence = r.lastFence
	return out
}

// first takes the first read: every holder is reported as holding.
func (t *holdersTracker) first(start, end time.Time, r holdersRead) []event {
	t.started = true
	t.lastFence = r.lastFence
	var out []event
	for _, h := range r.holders {
		t.cur[h.id] = at(start, h)
		out = append(out, t.event(evHolding, end, h, len(r.holders)))
	}
	return out
}

// drop forgets the holders gone, oldest fence first, and returns their
// events: freed by force while "forced" messages last, expired when they
// vanished after their TTL could have run out, freed otherwise.
func (t *holdersTracker) drop(end, goneAt time.Time, gone []*heldAt) []event {
	forced := 0
	for _, f := range t.msgs {
		if f {
			forced++
		}
	}
	var out []event
	for _, h := range gone {
		delete(t.cur, h.id)
		ev := t.event(evFreed, end, h.heldBy, len(t.cur))
		if forced > 0 {
			forced--
			ev.Forced = true
		} else if !h.deadline.IsZero() && !goneAt.Before(h.deadline) {
			ev.Kind = evExpired
		}
		ev.TTL = 0
		out = append(out, ev)
	}
	return out
}

// knows reports whether fence is a holder's read now or gone now.
func (t *holdersTracker) knows(fence int64, now map[string]heldBy, gone []*heldAt) bool {
	for _, h := range now {
		if h.fence == fence {
			return true
		}
	}
	for _, h := range gone {
		if h.fence == fence {
			return true
		}
	}
	return false
}

// event returns the event kind of holder h, with held holders after it.
func (t *holdersTracker) event(kind string, now time.Time, h heldBy, held int) event {
	return event{Kind: kind, At: now, Fence: h.fence, Owner: h.owner, TTL: h.ttl,
		Of: t.kind, Token: h.token, Mode: h.mode, Held: held, Permits: t.permits}
}

func at(start time.Time, h heldBy) *heldAt {
	a := &heldAt{heldBy: h}
	if h.ttl >= 0 {
		// The server read the TTL after start: it lives at least until
		// start+TTL.
		a.deadline = start.Add(h.ttl)
	}
	return a
}
