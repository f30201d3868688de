package redlock

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/tasks"
)

// each runs f on every node in parallel, on goroutines Config.Tasks tracks,
// with a context bounded by timeout, not ended when the caller stops reading
// (a straggler's grant is the lease's), nor with ctx when detach is set.
func each[T any](ctx context.Context, q *Quorum, timeout time.Duration, detach bool, f func(ctx context.Context, i int, d *deployment.Deployment) T) *results[T] {
	base := ctx
	if detach {
		base = context.WithoutCancel(ctx)
	}
	nctx, cancel := context.WithTimeout(base, timeout)
	var left atomic.Int32
	left.Store(int32(len(q.nodes)))
	returned := func() {
		if left.Add(-1) == 0 {
			cancel()
		}
	}
	clock := q.cfg.Clock
	r := &results[T]{ch: make(chan T, len(q.nodes)), n: len(q.nodes), ctx: ctx, timer: clock.NewTimer(timeout),
		clock: clock, start: clock.Now()}
	for i, d := range q.nodes {
		q.cfg.Tasks.Add()
		go func() {
			defer q.cfg.Tasks.Done()
			defer returned()
			r.ch <- f(nctx, i, d)
		}()
	}
	return r
}

// results are the nodes' results of each, as they come.
type results[T any] struct {
	ch     chan T // buffered: no node's goroutine waits for the reader
	n      int    // how many results come: one per node
	ctx    context.Context
	closed <-chan struct{} // an attempt's: the Locker's Close stops the reading too
	timer  *time.Timer     // the calls' timeout
	clock  tasks.Clock
	start  time.Time // when the calls began
}

// collect passes the results to take as they come, until every node has
// answered, the timeout has passed or ctx has ended, or for a grace once take
// has reported the outcome decided (and it must go on reporting so).
func (r *results[T]) collect(take func(T) (decided bool)) {
	var grace <-chan time.Time
	for range r.n {
		v, more := r.nextOr(grace)
		if !more {
			return
		}
		if take(v) && grace == nil {
			t := graceTimer(r.clock, r.start)
			defer t.Stop()
			grace = t.C
		}
	}
}

// graceTimer times how long the nodes that have not answered get once a call
// begun at start is decided: about one more round trip (twice what it took,
// within MinGrace and MaxGrace), so the healthy ones have applied the call
// when it returns and a hung minority holds it up no longer.
func graceTimer(clock tasks.Clock, start time.Time) *time.Timer {
	return clock.NewTimer(min(max(MinGrace, 2*clock.Now().Sub(start)), MaxGrace))
}

// MinGrace leaves room for a reply on its way on a busy machine; MaxGrace
// bounds what a hung minority costs every call.
const (
	MinGrace = 5 * time.Millisecond
	MaxGrace = 100 * time.Millisecond
)

// next returns the next result, or false once the timeout has passed or
// the caller's context has ended.
func (r *results[T]) next() (T, bool) { return r.nextOr(nil) }

// nextOr is next, also ending when or fires; a result already there comes first.
func (r *results[T]) nextOr(or <-chan time.Time) (T, bool) {
	select {
	case v := <-r.ch:
		return v, true
	default:
	}
	select {
	case v := <-r.ch:
		return v, true
	case <-r.timer.C:
	case <-r.ctx.Done():
	case <-r.closed:
	case <-or:
	}
	var zero T
	return zero, false
}

func (r *results[T]) stop() { r.timer.Stop() }
