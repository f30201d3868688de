package redlock

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/tasks"
)

// each runs f on every node in parallel, on goroutines the Locker tracks,
// with a context bounded by timeout that ends when every call has
// returned, not when the caller stops reading (a straggler's grant is part
// of the lease, released with it), and with detach not with ctx either.
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
	start  time.Time // when the calls began, on clock
}

// collect passes the results to take as they come, until every node has
// answered, the timeout has passed or the caller's context has ended, or
// for a grace (see quorumGrace) once take has reported the outcome
// decided: the nodes that answer within it have applied the call when it
// returns, and a hung node holds it up no longer. take must go on
// reporting true once it has.
func (r *results[T]) collect(take func(T) (decided bool)) {
	var grace <-chan time.Time
	for range r.n {
		v, more := r.nextOr(grace)
		if !more {
			return
		}
		if take(v) && grace == nil {
			t := r.clock.NewTimer(quorumGrace(r.clock.Now().Sub(r.start)))
			defer t.Stop()
			grace = t.C
		}
	}
}

// quorumGrace is how long the nodes that have not answered get once a
// call is decided, took after it began: about one more round trip (twice
// took, at least minGrace, at most maxGrace), so that the healthy ones
// have answered when the call returns.
func quorumGrace(took time.Duration) time.Duration {
	return min(max(minGrace, 2*took), maxGrace)
}

// Bounds of quorumGrace: minGrace leaves room for a reply on its way on a
// busy machine; maxGrace bounds what a hung minority costs every call.
const (
	minGrace = 5 * time.Millisecond
	maxGrace = 100 * time.Millisecond
)

// next returns the next result, or false once the timeout has passed or
// the caller's context has ended.
func (r *results[T]) next() (T, bool) { return r.nextOr(nil) }

// nextOr is next, also ending when or fires. A result already there comes
// first.
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
