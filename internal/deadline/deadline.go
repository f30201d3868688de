// Package deadline bounds calls whose context is never cancelled (Done nil)
// with one timer for all of them, armed for the earliest deadline, where
// context.WithTimeout takes a timer and four allocations per call.
package deadline

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A Heap ends the contexts made by WithTimeout: a call that completes takes
// its context out; an expired one's Done is closed, as a timer context's.
// Its time is the real one, not a test clock's: a context's deadline is,
// for the Redis client and for every caller that reads it. The zero Heap
// is ready to use.
type Heap struct {
	mu    sync.Mutex
	due   dueHeap     // guarded by mu; the contexts not yet ended, earliest first
	timer *time.Timer // guarded by mu; nil until the first deadline
	armed time.Time   // guarded by mu; when timer fires; zero while it is not armed
}

// A boundCtx has its parent's values, and its deadline for its only
// cancellation: its parent is never cancelled (see withTimeout).
type boundCtx struct {
	context.Context
	at    time.Time
	done  chan struct{}
	state atomic.Int32 // 0 running; boundExpired, boundCancelled once done is closed
	i     int          // its index in Heap.due, guarded by Heap.mu; -1 out of it
}

const (
	boundExpired   = 1
	boundCancelled = 2
)

func (c *boundCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *boundCtx) Done() <-chan struct{}       { return c.done }

func (c *boundCtx) Err() error {
	switch c.state.Load() {
	case boundExpired:
		return context.DeadlineExceeded
	case boundCancelled:
		return context.Canceled
	}
	return nil
}

// WithTimeout returns a context with ctx's values that ends after timeout,
// or when ctx does, and its cancel function, as context.WithTimeout. A ctx
// that is never cancelled (Done nil: context.Background, WithoutCancel)
// gets a context of the heap's.
func (d *Heap) WithTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		return context.WithTimeout(ctx, timeout)
	}
	c := &boundCtx{Context: ctx, at: time.Now().Add(timeout), done: make(chan struct{})}
	d.add(c)
	return c, func() { d.end(c, boundCancelled) }
}

func (d *Heap) add(c *boundCtx) {
	d.mu.Lock()
	defer d.mu.Unlock()
	heap.Push(&d.due, c)
	if !d.armed.IsZero() && !c.at.Before(d.armed) {
		return // the timer fires first
	}
	d.armed = c.at
	if d.timer == nil {
		d.timer = time.AfterFunc(time.Until(c.at), d.fire)
	} else {
		d.timer.Reset(time.Until(c.at))
	}
}

// end takes c out and closes its Done, if it is still in.
func (d *Heap) end(c *boundCtx, state int32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c.i < 0 {
		return
	}
	heap.Remove(&d.due, c.i)
	c.state.Store(state)
	close(c.done)
}

// fire ends the contexts whose deadline has passed, and arms the timer for
// the next. A fire that finds none (its context ended early) only arms.
func (d *Heap) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for len(d.due) > 0 && !d.due[0].at.After(now) {
		c := heap.Pop(&d.due).(*boundCtx)
		c.state.Store(boundExpired)
		close(c.done)
	}
	d.armed = time.Time{}
	if len(d.due) > 0 {
		d.armed = d.due[0].at
		d.timer.Reset(time.Until(d.armed))
	}
}

// dueHeap orders contexts by deadline (container/heap).
type dueHeap []*boundCtx

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}

func (h *dueHeap) Push(x any) {
	c := x.(*boundCtx)
	c.i = len(*h)
	*h = append(*h, c)
}

func (h *dueHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.i = -1
	return c
}
