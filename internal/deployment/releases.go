package deployment

import (
	"context"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// Releases returns the wake-ups of a plain waiter of the lock (or
// semaphore) at key: its releases ("Waiting" in GUARANTEES.md). A release
// wakes the earliest plain waiter, which passes the wake-up on if it does
// not use it; a grant to a fair waiter wakes none.
func (d *Deployment) Releases(key string) store.Wakeup { return &releases{d: d, key: key} }

type releases struct {
	d     *Deployment
	key   string
	w     *notify.Waiter
	taken int // wake-ups taken since the last attempt's answer (a pause's end, the drain after it)
}

func (r *releases) Next(_ store.Attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if r.w == nil {
		r.w = r.d.Listen(r.key, nil, releaseHearer{}) // nil after Close, which the wait hears
	}
	if r.w == nil {
		return nil, d
	}
	if r.taken > 0 && !busy {
		r.w.PassOn()
	}
	r.taken = 0
	return r.w.C(), d
}

func (r *releases) Woken() time.Duration { r.taken++; return 0 }

func (r *releases) Leave(_ store.Lease, took bool) {
	if r.w == nil {
		return
	}
	// A call that gives up after a wake-up, or took the lock after two (a
	// semaphore's two permits freed at once), leaves one to the next.
	if r.taken > 1 || r.taken > 0 && !took {
		r.w.PassOn()
	}
	r.w.Leave()
}

// releaseHearer is what a plain waiter makes of release.lua's messages: a
// grant to a fair waiter wakes none, a release one.
type releaseHearer struct{}

func (releaseHearer) Hear(m notify.Message) notify.Hearing {
	switch {
	case m.Payload == "":
		return notify.WakeAll
	case m.Head == "granted":
		return notify.Ignore
	}
	return notify.WakeOne
}

func (releaseHearer) Lingers() bool { return false }

// Inspect reads the lock called name and its fence counter, and with
// waiters how many subscribe to its channel, changing nothing.
func (d *Deployment) Inspect(ctx context.Context, name string, waiters bool) (store.Holding, error) {
	key := keys.Lock(d.cfg.KeyPrefix, name)
	h, err := d.read(ctx, key, key+keys.Fence)
	if err == nil && waiters {
		h.Waiters, err = d.Subscribers(ctx, key)
	}
	return h, err
}

// read runs inspect.lua on the lock key and its fence counter.
func (d *Deployment) read(ctx context.Context, key, fenceKey any) (store.Holding, error) {
	reply, err := d.Eval(ctx, script.Inspect, []any{key, fenceKey})
	if err != nil {
		return store.Holding{}, err
	}
	return store.InspectReply(reply)
}
