package fencegocron

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fencelock/fencelock"
)

// A Locker is a gocron.Locker that locks each run of a job with fencelock,
// under the job's name. It is safe for concurrent use; give one to each
// scheduler (gocron.WithDistributedLocker) and call Close after the
// scheduler's Shutdown. The zero Locker is not usable: its Lock returns an
// error matching fencelock.ErrInvalid.
type Locker struct {
	locker  *fencelock.Locker
	minHold time.Duration

	mu     sync.Mutex
	runs   map[context.Context][]*run // guarded by mu; runs between Lock and Unlock, by the context gocron passed
	closed bool                       // guarded by mu
	stop   chan struct{}              // closed by Close: minimum holds end at once
	holds  sync.WaitGroup             // goroutines keeping a lock for its minimum hold; Add under mu
}

var (
	_ gocron.Locker = (*Locker)(nil)
	_ gocron.Lock   = (*run)(nil)
)

// An Option configures a Locker.
type Option func(*Locker)

// WithMinHold keeps each lock held for at least d after it was acquired,
// also when the job ends sooner, so that a scheduler whose firing of the
// same tick comes up to d later finds the lock taken and skips the run
// (gocron's "time splay"). The lock stays renewed meanwhile, and is released
// when d has passed. Choose d longer than the spread of your schedulers'
// firings and shorter than the job's interval, or the next tick finds the
// lock still held. A negative d panics. Default 0: released when the job
// ends.
func WithMinHold(d time.Duration) Option {
	if d < 0 {
		panic(fmt.Sprintf("fencegocron: WithMinHold %v is negative", d))
	}
	return func(l *Locker) { l.minHold = d }
}

// NewLocker returns a Locker that takes its locks with locker, whose Options
// (TTL, KeyPrefix, OnLost, ...) apply. A nil locker or a nil Option panics.
func NewLocker(locker *fencelock.Locker, opts ...Option) *Locker {
	if locker == nil {
		panic("fencegocron: nil fencelock.Locker")
	}
	l := &Locker{locker: locker, runs: make(map[context.Context][]*run), stop: make(chan struct{})}
	for _, opt := range opts {
		if opt == nil {
			panic("fencegocron: nil Option")
		}
		opt(l)
	}
	return l
}

// run is one run of a job, from Lock to Unlock. Lock sets lease, kept,
// work, endWork and acquired under Locker.mu before it returns the run; they
// do not change after.
type run struct {
	l        *Locker
	ctx      context.Context // the job's context, as gocron passed it to Lock
	name     string
	lease    *fencelock.Lease // nil until acquired
	kept     context.Context  // the lease's KeepAlive context: cancelled with ErrLost when lost, not when ctx ends
	work     context.Context  // the Task's context: kept's, also cancelled with ctx's cause when ctx ends
	endWork  func()           // cancels work and stops watching ctx; Unlock calls it
	acquired time.Time        // when Acquire returned
	unlocked sync.Once
}

// Lock takes the lock called key (gocron passes the job's name) and starts
// its watchdog, which renews it until Unlock, also after ctx ended (gocron
// cancels the job's context at shutdown or removal while the job may still
// run). gocron calls it before each run of the job, with the job's context,
// and skips the run if it returns an error: the error of fencelock's
// Locker.Acquire (ErrNotObtained when another scheduler holds the lock,
// ErrUnavailable, ErrMisconfigured, ErrInvalid for a name containing '{' or
// '}', or ctx's error); without a Redis call, an error matching ErrInvalid
// for gocron's default name of a Locker.Task job (see Task), or one
// matching ErrNotObtained while a previous run of the same job on this
// Locker has not returned yet (after losing its lock, it may still be
// running). gocron passes the error to an AfterLockError listener.
//
// Lock tries once: a scheduler that finds the lock taken skips the tick. It
// returns when Redis answers, ctx is cancelled, or the go-redis client gives
// up. fencelock's Options.FailOpen does not apply: when Redis is
// unavailable, the run is skipped.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if l == nil || l.locker == nil {
		return nil, fmt.Errorf("fencegocron: Locker not created with NewLocker: %w", fencelock.ErrInvalid)
	}
	if key == taskName {
		return nil, fmt.Errorf("fencegocron: job %q is a Locker.Task job without a name: give it gocron.WithName, "+
			"or all such jobs share one lock: %w", key, fencelock.ErrInvalid)
	}
	r := &run{l: l, ctx: ctx, name: key}
	registered := mapKey(ctx)
	if registered {
		l.mu.Lock()
		for _, other := range l.runs[ctx] {
			if other.name == key {
				l.mu.Unlock()
				return nil, fmt.Errorf("fencegocron: job %q: its previous run on this scheduler has not returned: %w",
					key, fencelock.ErrNotObtained)
			}
		}
		l.runs[ctx] = append(l.runs[ctx], r) // reserved while Acquire runs; lease stays nil
		l.mu.Unlock()
	}
	lease, err := l.locker.Acquire(ctx, key)
	if err != nil {
		if registered {
			l.forget(r)
		}
		return nil, err
	}
	// Renewed until Unlock, whatever becomes of ctx: KeepAlive releases the
	// lease once its ctx ends, and gocron cancels the job's context at
	// shutdown while the job function may still run.
	kept := lease.KeepAlive(context.WithoutCancel(ctx))
	work, cancel := context.WithCancelCause(kept)
	// The AfterFunc's goroutine, started when ctx ends, only cancels work;
	// endWork stops it from starting after Unlock.
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	endWork := func() { stop(); cancel(errUnlocked) }
	l.mu.Lock()
	r.lease, r.kept, r.work, r.endWork, r.acquired = lease, kept, work, endWork, time.Now()
	l.mu.Unlock()
	return r, nil
}

// errUnlocked is the cause of a Task's context after Unlock, when neither a
// loss nor gocron ended it before.
var errUnlocked = fmt.Errorf("fencegocron: the run ended: %w", fencelock.ErrNotHeld)

// mapKey reports whether ctx can be a map key. gocron's job contexts
// always can (they are pointers).
func mapKey(ctx context.Context) bool {
	return ctx != nil && reflect.TypeOf(ctx).Comparable()
}

// forget removes r from the runs.
func (l *Locker) forget(r *run) {
	if !mapKey(r.ctx) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := slices.DeleteFunc(l.runs[r.ctx], func(other *run) bool { return other == r })
	if len(runs) == 0 {
		delete(l.runs, r.ctx)
	} else {
		l.runs[r.ctx] = runs
	}
}

// current returns the run that holds its lock for the job whose context is
// ctx, or nil if there is none, or more than one (a context shared by several
// jobs, which gocron never does).
func (l *Locker) current(ctx context.Context) *run {
	if !mapKey(ctx) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if runs := l.runs[ctx]; len(runs) == 1 && runs[0].lease != nil {
		return runs[0]
	}
	return nil
}

// lostCause returns why the run's lease was lost while its work ran, or nil.
func (r *run) lostCause() error {
	switch cause := context.Cause(r.kept); {
	case errors.Is(cause, fencelock.ErrLost):
		return cause
	case cause != nil && errors.Is(cause, fencelock.ErrNotHeld):
		return nil // the work released the lease itself
	}
	if !time.Now().Before(r.lease.Deadline()) {
		// The deadline passed as the work returned, before the watchdog's
		// timer was handled: that counts as lost too, as for RunWithLock.
		return fmt.Errorf("%w: deadline passed before the job returned", fencelock.ErrLost)
	}
	return nil
}

// Unlock releases the run's lock: gocron calls it when the job function
// has returned, also after a shutdown or removal. With WithMinHold, a lock
// held for less than the minimum is released only when the minimum has
// passed (or at Close), in the background, and Unlock returns nil at once.
// Otherwise Unlock releases it before it returns, on a context that keeps
// ctx's values but not its cancellation (gocron passes the job's context,
// which a shutdown has cancelled), bounded by fencelock's
// Options.ReleaseTimeout, and returns fencelock's Lease.Release error:
// ErrNotHeld (also matching ErrLost when the lease was lost) when the lock
// was no longer this run's, ErrUnavailable or ErrMisconfigured when it may
// still be held (it then expires after its TTL). gocron ignores the error.
// A second Unlock returns an error matching ErrNotHeld.
func (r *run) Unlock(ctx context.Context) error {
	var (
		err   error
		first bool
	)
	r.unlocked.Do(func() { first, err = true, r.unlock(ctx) })
	if !first {
		return fmt.Errorf("fencegocron: job %q: unlocked already: %w", r.name, fencelock.ErrNotHeld)
	}
	return err
}

func (r *run) unlock(ctx context.Context) error {
	l := r.l
	l.forget(r)
	r.endWork()
	ctx = context.WithoutCancel(ctx)
	if hold := l.minHold - time.Since(r.acquired); hold > 0 && !errors.Is(context.Cause(r.kept), fencelock.ErrLost) {
		l.mu.Lock()
		if !l.closed {
			l.holds.Add(1)
			l.mu.Unlock()
			go func() {
				defer l.holds.Done()
				t := time.NewTimer(hold)
				defer t.Stop()
				select {
				case <-t.C:
				case <-l.stop:
				}
				// A failed release leaves the lock to expire after its TTL;
				// fencelock's Logger reports a lost lease.
				_ = r.lease.Release(ctx)
			}()
			return nil
		}
		l.mu.Unlock()
	}
	return r.lease.Release(ctx)
}

// Close ends the minimum holds (WithMinHold) at once, releasing their locks,
// and waits for them, each release bounded by fencelock's
// Options.ReleaseTimeout. A scheduler firing late could then run the same
// tick again. Locks of runs still going on are released by their Unlock.
// Call Close after the scheduler's Shutdown, and before the fencelock
// Locker's Close; the Locker keeps working after Close, without minimum
// holds. Close always returns nil.
func (l *Locker) Close() error {
	if l == nil || l.stop == nil {
		return nil
	}
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
	l.mu.Unlock()
	l.holds.Wait()
	return nil
}

// Task returns a gocron task that runs work under the lock Lock took for
// the run, with the run's Lease, on a context of the run's own: it is
// cancelled with cause fencelock.ErrLost as soon as the lease is no longer
// certainly held (see fencelock's Lease.KeepAlive), and with gocron's cause
// when gocron's job context ends (scheduler shutdown, job removed). The
// lock stays held, renewed, until work returns and Unlock releases it. Pass
// lease.Fence() to what work writes.
//
// The task returns work's error, joined (on one line) with an error matching
// fencelock.ErrLost when the lease was lost while work ran, even if work
// returned nil: another scheduler may have run the job meanwhile. gocron
// passes a non-nil error to an AfterJobRunsWithError listener.
//
// The task must run under this Locker (gocron.WithDistributedLocker or
// gocron.WithDistributedJobLocker) and with the context gocron gives it, not
// one passed to gocron.NewTask. Otherwise it finds no lock for its run, does
// not call work, and returns an error matching fencelock.ErrInvalid. Its job
// needs a gocron.WithName: gocron's default name would be the same for every
// Task job, which would then share one lock, so Lock refuses it and the run
// is skipped. A nil work panics.
func (l *Locker) Task(work func(ctx context.Context, lease *fencelock.Lease) error) gocron.Task {
	if work == nil {
		panic("fencegocron: nil work function")
	}
	return gocron.NewTask(taskFunc(l, work))
}

// taskFunc returns the function of Task's gocron task. gocron names a job
// without gocron.WithName after its task's function; inlined, this closure
// would be named after each caller, with a number that changes with the
// caller's code (from one build of a service to the next), so taskFunc is
// never inlined and the closure has one name, taskName, which Lock refuses.
//
//go:noinline
func taskFunc(l *Locker, work func(ctx context.Context, lease *fencelock.Lease) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		r := l.current(ctx)
		if r == nil {
			return errNoLock
		}
		werr := work(r.work, r.lease)
		lost := r.lostCause()
		switch {
		case lost == nil || errors.Is(werr, fencelock.ErrLost):
			return werr
		case werr == nil:
			return lost
		default:
			return fmt.Errorf("%w; %w", werr, lost)
		}
	}
}

// taskName is gocron's default name for a job whose task Task made: the
// name of taskFunc's closure, computed as gocron does (addOrUpdateJob in
// gocron v2's scheduler.go).
var taskName = runtime.FuncForPC(reflect.ValueOf(taskFunc(nil, nil)).Pointer()).Name()

// errNoLock is what a Task returns when its run holds no lock of the Locker.
var errNoLock = fmt.Errorf("fencegocron: the task's run holds no lock of this Locker (schedule the job "+
	"with gocron.WithDistributedLocker(locker), and do not give the task a context of your own): %w", fencelock.ErrInvalid)
