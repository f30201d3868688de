package fencelock

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// An Observer is told what a Locker does, for metrics and traces (module
// github.com/fencelock/fencelock/otel implements it). Its methods run on the
// goroutine doing the work, must return quickly and must not call the Locker;
// the Redis calls, and RunWithLock's work, run in the context Start returns.
type Observer interface {
	// Start is called when Acquire, Release or RunWithLock starts.
	Start(ctx context.Context, op Op, name string) context.Context
	// End is called when it ends, with the context Start returned: once for
	// each Start, also when the work of RunWithLock or RunWithLocks panics or
	// calls runtime.Goexit.
	End(ctx context.Context, e Event)
	// Notify is called for each renewal (OpRenew) and loss (OpLost), with the
	// context of the call that took the lease (RunWithLock's, else Acquire's).
	Notify(ctx context.Context, e Event)
}

// Op is what an Event is about.
type Op int

const (
	OpAcquire Op = iota + 1 // Acquire, also within RunWithLock
	OpRelease               // Release, also within RunWithLock
	OpRun                   // RunWithLock, from its acquisition to its release
	OpRenew                 // a renewal by the watchdog
	OpLost                  // a lease lost while its watchdog ran
)

var opNames = [...]string{OpAcquire: "acquire", OpRelease: "release", OpRun: "run", OpRenew: "renew", OpLost: "lost"}

func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return "op"
}

// Outcome is how an operation ended, as a class a metric can count by.
type Outcome string

// Outcomes, from an Event's Err.
const (
	OutcomeOK            Outcome = "ok"            // obtained, released, renewed
	OutcomeBusy          Outcome = "busy"          // ErrNotObtained
	OutcomeNotHeld       Outcome = "not_held"      // ErrNotHeld
	OutcomeLost          Outcome = "lost"          // ErrLost
	OutcomeUnavailable   Outcome = "unavailable"   // ErrUnavailable
	OutcomeMisconfigured Outcome = "misconfigured" // ErrMisconfigured
	OutcomeInvalid       Outcome = "invalid"       // ErrInvalid
	OutcomeCancelled     Outcome = "cancelled"     // the context ended first
	OutcomeClosed        Outcome = "closed"        // ErrClosed
	OutcomeFailed        Outcome = "failed"        // RunWithLock: the work's own error
)

// An Event is one observed operation or happening.
type Event struct {
	Op       Op
	Name     string  // the lock's name
	Lease    *Lease  // the lease, when there is one (nil for a failed Acquire)
	Outcome  Outcome // see OutcomeOf
	Err      error
	Fence    int64         // the lease's fence, when there is a lease
	Duration time.Duration // how long the operation took (OpAcquire, OpRelease, OpRun)
	Waited   time.Duration // OpAcquire: time waiting between attempts for a busy lock
	Handoff  time.Duration // OpAcquire woken by a release: wake-up's arrival to grant; 0 if not known
	Held     time.Duration // how long held: for OpLost, or an OpRelease that deleted an unlost lease's lock; else 0
}

// OutcomeOf returns the outcome class of an operation that returned err.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, ErrLost):
		return OutcomeLost
	case errors.Is(err, ErrNotObtained):
		return OutcomeBusy
	case errors.Is(err, ErrNotHeld):
		return OutcomeNotHeld
	case errors.Is(err, ErrUnavailable):
		return OutcomeUnavailable
	case errors.Is(err, ErrMisconfigured):
		return OutcomeMisconfigured
	case errors.Is(err, ErrInvalid):
		return OutcomeInvalid
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCancelled
	}
	return OutcomeFailed
}

// acquireObserved is Acquire without failing open, seen by the Observer.
func (l *Locker) acquireObserved(ctx context.Context, name string, co callOptions, open bool) (*Lease, error) {
	obs := l.opts.Observer
	if obs == nil {
		return l.acquireWith(ctx, name, co, open, nil)
	}
	ctx = obs.Start(ctx, OpAcquire, name)
	var st acquireStats
	start := l.clock.Now()
	got, err := l.acquireWith(ctx, name, co, open, &st)
	e := Event{Op: OpAcquire, Name: name, Lease: got, Outcome: OutcomeOf(err), Err: err,
		Duration: l.clock.Now().Sub(start), Waited: st.waited, Handoff: st.handoff}
	if got != nil {
		e.Fence = got.fence
		if got.obsCtx == nil {
			got.obsCtx = ctx
		}
	}
	obs.End(ctx, e)
	return got, err
}

// errAborted is the error of an OpRun whose work panicked or called Goexit.
var errAborted = errors.New("fencelock: the work panicked or called runtime.Goexit")

// observeRun runs run within an OpRun, ended also on a panic, naming *lease.
func (l *Locker) observeRun(ctx context.Context, name string, run func(ctx context.Context, lease **Lease) error) error {
	obs := l.opts.Observer
	ctx = obs.Start(ctx, OpRun, name)
	start := l.clock.Now()
	var lease *Lease
	err := errAborted // unless run returns
	defer func() {
		e := Event{Op: OpRun, Name: name, Lease: lease, Outcome: OutcomeOf(err), Err: err, Duration: l.clock.Now().Sub(start)}
		if lease != nil {
			e.Fence = lease.fence
		}
		obs.End(ctx, e)
	}()
	err = run(ctx, &lease)
	return err
}

// observeRelease runs lease's release between the Observer's Start and End.
func (l *Locker) observeRelease(ctx context.Context, lease *Lease, release func(ctx context.Context) error) error {
	obs := l.opts.Observer
	ctx = obs.Start(ctx, OpRelease, lease.name)
	start := l.clock.Now()
	err := release(ctx)
	obs.End(ctx, releaseEvent(lease, err, start, l.clock.Now()))
	return err
}

// releaseEvent is the OpRelease of lease, from start to now, that returned err.
func releaseEvent(lease *Lease, err error, start, now time.Time) Event {
	e := Event{Op: OpRelease, Name: lease.name, Lease: lease, Outcome: OutcomeOf(err), Err: err,
		Fence: lease.fence, Duration: now.Sub(start)}
	if err == nil && lease.lostCause() == nil {
		e.Held = now.Sub(lease.acquired)
	}
	return e
}

// acquireStats is what an Observer learns of an Acquire.
type acquireStats struct {
	waited  time.Duration // asleep between attempts
	handoff time.Duration // from the wake-up before the winning attempt to the grant
}

// reportLost tells the Observer, the log and OnLost that lease was lost.
func (l *Locker) reportLost(lease *Lease, cause error, deadline time.Time) {
	now := l.clock.Now()
	if obs := l.opts.Observer; obs != nil {
		obs.Notify(lease.observed(), Event{Op: OpLost, Name: lease.name, Lease: lease, Outcome: OutcomeLost, Err: cause,
			Fence: lease.fence, Held: now.Sub(lease.acquired)})
	}
	l.opts.Logger.LogAttrs(context.Background(), slog.LevelError, "fencelock: lease lost",
		slog.String("lock", lease.name), slog.Int64("fence", lease.fence),
		slog.Duration("held", now.Sub(lease.acquired)), slog.Duration("until_deadline", deadline.Sub(now)),
		slog.Any("cause", cause))
	if f := l.opts.OnLost; f != nil {
		f(lease, cause)
	}
}

// warnPublish logs, once per Locker, that a release could not publish its wake-up.
func (l *Locker) warnPublish(name string, perr error) {
	if perr == nil || !l.publishWarned.CompareAndSwap(false, true) {
		return
	}
	l.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn,
		"fencelock: a release could not publish its wake-up (logged once): waiters fall back to the holder's TTL and backoff",
		slog.String("lock", name), slog.Any("error", perr))
}
