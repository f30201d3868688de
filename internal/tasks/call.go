package tasks

import (
	"sync/atomic"
	"time"
)

// Call runs f and returns its result with done true, or returns done false
// as soon as stop1 or stop2 is closed: f then runs to its end on a
// goroutine that g tracks, and late, if not nil, gets its result there.
// With two nil channels f runs on the caller's goroutine.
//
// This is how every call returns by its caller's deadline whatever the
// Redis client's options: without ContextTimeoutEnabled, go-redis waits for
// ReadTimeout on a hung connection, and retries a command that timed out.
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
	// A call that honours the context (go-redis's dial loop, a client with
	// ContextTimeoutEnabled) returns at once, often with the cause of its
	// failure ("connection refused"): give it a moment.
	t := g.clock.NewTimer(Grace)
	select {
	case <-c.done:
	case <-t.C:
	}
	t.Stop()
	if !c.state.CompareAndSwap(0, 2) { // finished meanwhile
		<-c.done
		return c.res, true
	}
	return res, false
}

// Grace is how long a call whose caller's context has ended still waits
// for its result.
const Grace = 5 * time.Millisecond

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
		c.late(c.res) // the caller has returned
	}
}

// A job is what a worker of Group.run runs.
type job interface{ run() }

// run runs j on a tracked goroutine: a worker that waits for work, or a
// new one. A worker waits workerIdle for more after each job, unless
// maxIdlers already do, and exits then or at Close. A goroutine made for
// each call would grow its stack anew in go-redis's calls, every time:
// runtime.copystack took 14% of the CPU of a loop of acquire+release on
// go-redis's default options, where each of them needs one.
func (g *Group) run(j job) {
	select {
	case g.jobs <- j: // a worker was waiting
		return
	default:
	}
	g.mu.Lock()
	g.n++
	stop := g.stopLocked()
	g.mu.Unlock()
	go g.work(j, stop)
}

// work runs j, then the jobs it receives, until it waits workerIdle for
// none or stop is closed.
func (g *Group) work(j job, stop <-chan struct{}) {
	defer g.Done()
	// Real time, not the Group's clock: Reset, which each job needs, would
	// be real time on a Clock's timer too, and a new timer a job would cost
	// an allocation on the hot path; the timer only reclaims the goroutine.
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.run()
		if g.idlers.Add(1) > maxIdlers {
			g.idlers.Add(-1)
			return
		}
		idle.Reset(workerIdle)
		var more bool
		select {
		case j = <-g.jobs:
			more = true
		case <-idle.C:
		case <-stop:
		}
		g.idlers.Add(-1)
		if !more {
			return
		}
	}
}

// How long a worker waits for more work, and how many wait at most: a
// burst of calls leaves no more goroutines behind.
const (
	workerIdle = 250 * time.Millisecond
	maxIdlers  = 16
)
