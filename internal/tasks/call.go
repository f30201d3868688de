package tasks

import (
	"sync/atomic"
	"time"
)

// Call runs f and returns its result with done true, or done false once
// stop1 or stop2 is closed: f then runs to its end on a goroutine g tracks,
// and late, if not nil, gets its result there. With two nil channels f runs
// on the caller's goroutine.
func Call[T any](g *Group, stop1, stop2 <-chan struct{}, f func() T, late func(T)) (res T, done bool) {
	if stop1 == nil && stop2 == nil {
		return f(), true
	}
	c := &pending[T]{done: make(chan struct{}), f: f, late: late}
	g.run(c)
	select {
	case <-c.done:
		return c.res, true
	case <-stop1:
	case <-stop2:
	}
	// A call that honours the context returns at once, often with the cause
	// of its failure ("connection refused"): give it a moment.
	waitAtMost(g.clock, c.done, grace)
	if !c.state.CompareAndSwap(0, 2) { // finished meanwhile
		<-c.done
		return c.res, true
	}
	return res, false
}

// grace is how long Call still waits for a result once its caller has gone.
const grace = 5 * time.Millisecond

// pending is a call's result in transit.
type pending[T any] struct {
	f     func() T
	late  func(T)       // nil, or what gets the result once the caller has gone
	res   T             // written before done is closed
	done  chan struct{} // closed when f has returned
	state atomic.Int32  // 0 running, 1 result taken by the caller, 2 caller gone
}

func (c *pending[T]) run() {
	c.res = c.f()
	close(c.done)
	if !c.state.CompareAndSwap(0, 1) && c.late != nil {
		c.late(c.res)
	}
}

// A job is what a worker of Group.run runs.
type job interface{ run() }

// run runs j on a worker waiting for work, or on a new tracked one. Workers
// are reused because a goroutine per call grows its stack anew in go-redis's
// calls: runtime.copystack took 14% of the CPU of an acquire+release loop.
func (g *Group) run(j job) {
	select {
	case g.jobs <- j:
		return
	default:
	}
	g.Add()
	go g.work(j)
}

// work runs j, then the jobs it receives, until it has waited workerIdle for
// none, MaxIdlers others already wait, or Close is called.
func (g *Group) work(j job) {
	defer g.Done()
	// Real time, not the Group's clock: Reset on a Clock's timer would be real
	// time too, and a new timer per job would allocate on the hot path.
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for j != nil {
		j.run()
		j = nil
		if g.idlers.Add(1) <= MaxIdlers {
			idle.Reset(workerIdle)
			select {
			case j = <-g.jobs:
			case <-idle.C:
			case <-g.stop:
			}
		}
		g.idlers.Add(-1)
	}
}

// How long a worker waits for more work, and how many wait at most (in
// each Group): a burst of calls leaves no more goroutines behind.
const (
	workerIdle = 250 * time.Millisecond
	MaxIdlers  = 16
)
