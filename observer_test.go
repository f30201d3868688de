package fencelock

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that records what it is told, and marks the
// contexts it returns with the operation, as a tracer's span would.
type recorder struct {
	mu     sync.Mutex
	starts []Op
	ends   []Event
	notes  []Event
	ctxOps map[Op][]string // for each End and Notify, the operations marked on its context
}

type opKey struct{ op Op }

func (r *recorder) Start(ctx context.Context, op Op, name string) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, op)
	return context.WithValue(ctx, opKey{op}, name)
}

func marked(ctx context.Context) []string {
	var ops []string
	for _, op := range []Op{OpRun, OpAcquire, OpRelease} {
		if ctx.Value(opKey{op}) != nil {
			ops = append(ops, op.String())
		}
	}
	return ops
}

func (r *recorder) End(ctx context.Context, e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e)
	if r.ctxOps == nil {
		r.ctxOps = map[Op][]string{}
	}
	r.ctxOps[e.Op] = marked(ctx)
}

func (r *recorder) Notify(ctx context.Context, e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, e)
	if r.ctxOps == nil {
		r.ctxOps = map[Op][]string{}
	}
	r.ctxOps[e.Op] = marked(ctx)
}

func (r *recorder) snapshot() (starts []Op, ends, notes []Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.starts...), append([]Event(nil), r.ends...), append([]Event(nil), r.notes...)
}

func TestObserverRunWithLock(t *testing.T) {
	e := newEnv(t, nil)
	rec := &recorder{}
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond, Observer: rec})
	name := uniqueName(t)
	var fence int64
	var workOps []string
	err := l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
		fence = lease.Fence()
		workOps = marked(ctx)
		time.Sleep(250 * time.Millisecond) // two renewals
		return nil
	})
	require.NoError(t, err)
	starts, ends, notes := rec.snapshot()
	assert.Equal(t, []Op{OpRun, OpAcquire, OpRelease}, starts)
	require.Len(t, ends, 3)
	assert.Equal(t, []string{"run"}, workOps, "the work's context is the run's: its spans are children of RunWithLock's")

	acq, rel, run := ends[0], ends[1], ends[2]
	assert.Equal(t, OpAcquire, acq.Op)
	assert.Equal(t, OutcomeOK, acq.Outcome)
	assert.Equal(t, name, acq.Name)
	assert.Equal(t, fence, acq.Fence)
	assert.Equal(t, []string{"run", "acquire"}, rec.ctxOps[OpAcquire], "Acquire's span is a child of the run's")
	assert.Equal(t, OpRelease, rel.Op)
	assert.Equal(t, OutcomeOK, rel.Outcome)
	assert.GreaterOrEqual(t, rel.Held, 250*time.Millisecond)
	assert.Equal(t, OpRun, run.Op)
	assert.Equal(t, OutcomeOK, run.Outcome)
	assert.Equal(t, fence, run.Fence)
	assert.GreaterOrEqual(t, run.Duration, rel.Held)

	require.NotEmpty(t, notes, "renewals")
	for _, n := range notes {
		assert.Equal(t, OpRenew, n.Op)
		assert.Equal(t, OutcomeOK, n.Outcome)
		assert.Equal(t, fence, n.Fence)
	}
	assert.Equal(t, []string{"run"}, rec.ctxOps[OpRenew], "renewals are events of the run")
}

// A run whose work panics or calls runtime.Goexit still ends its OpRun
// (a tracer's span would stay open forever), after the lease's release.
func TestObserverRunEndsWhenWorkPanics(t *testing.T) {
	e := newEnv(t, nil)
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			rec := &recorder{}
			l := e.locker(t, &Options{TTL: time.Second, Observer: rec})
			name := uniqueName(t)
			var fence int64
			done := make(chan any)
			go func() {
				defer func() { done <- recover() }()
				_ = l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
					fence = lease.Fence()
					if how == "panic" {
						panic("work failed")
					}
					runtime.Goexit()
					return nil
				})
			}()
			p := <-done
			if how == "panic" {
				assert.Equal(t, "work failed", p, "the panic goes on to the caller")
			}
			_, ends, _ := rec.snapshot()
			require.Len(t, ends, 3, "acquire, release and run")
			run := ends[len(ends)-1]
			assert.Equal(t, OpRun, run.Op)
			assert.Equal(t, name, run.Name)
			assert.Equal(t, fence, run.Fence)
			assert.Equal(t, OutcomeFailed, run.Outcome)
			assert.ErrorContains(t, run.Err, "panicked or called runtime.Goexit")
			assert.Equal(t, OpRelease, ends[len(ends)-2].Op, "the lease was released before the run ended")
			info, err := l.Inspect(ctx, name)
			require.NoError(t, err)
			assert.False(t, info.Held)
		})
	}
}

func TestObserverBusyWaitAndLoss(t *testing.T) {
	e := newEnv(t, nil)
	rec := &recorder{}
	// Slow polling: the waiter gets the lock by the release's wake-up, so
	// that its hand-off is known.
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond, Observer: rec,
		MinRetryBackoff: 20 * time.Second, MaxRetryBackoff: 20 * time.Second})
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)

	// A waiter woken by the release: its wait and its hand-off.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = held.Release(context.Background())
	}()
	waiter, err := l.Acquire(ctx, name, WithWait(5*time.Second))
	require.NoError(t, err)

	// A loss: the key deleted under a kept-alive lease.
	work := waiter.KeepAlive(ctx)
	require.NoError(t, e.admin.Del(ctx, waiter.Key()).Err())
	<-work.Done()
	require.Eventually(t, func() bool {
		_, _, notes := rec.snapshot()
		return len(notes) > 0 && notes[len(notes)-1].Op == OpLost
	}, 5*time.Second, time.Millisecond)
	_ = waiter.Release(ctx)

	_, ends, notes := rec.snapshot()
	var outcomes []Outcome
	var waited *Event
	for i, e := range ends {
		if e.Op == OpAcquire {
			outcomes = append(outcomes, e.Outcome)
			if e.Waited > 0 {
				waited = &ends[i]
			}
		}
	}
	assert.Equal(t, []Outcome{OutcomeOK, OutcomeBusy, OutcomeOK}, outcomes)
	require.NotNil(t, waited, "the waiting Acquire reports its wait")
	assert.GreaterOrEqual(t, waited.Waited, 50*time.Millisecond)
	assert.Positive(t, waited.Handoff, "woken by the release: the hand-off is known")
	assert.Less(t, waited.Handoff, time.Second)
	lost := notes[len(notes)-1]
	assert.Equal(t, OutcomeLost, lost.Outcome)
	assert.True(t, errors.Is(lost.Err, ErrLost))
	assert.Equal(t, waiter.Fence(), lost.Fence)
	assert.Equal(t, []string{"acquire"}, rec.ctxOps[OpLost], "a lease from Acquire: its events go to Acquire's context")
}

// A loss RunWithLock finds only as the work returns (the release after the
// work finds the lock gone: it was deleted between two renewals) is
// reported like one the watchdog found: Notify(OpLost) and OnLost, once,
// and the release's Held is 0, as the hold was counted with the loss.
func TestObserverLossFoundAfterTheWork(t *testing.T) {
	e := newEnv(t, nil)
	rec := &recorder{}
	var onLost []error
	var mu sync.Mutex
	l := e.locker(t, &Options{TTL: time.Minute, Observer: rec, OnLost: func(_ *Lease, cause error) {
		mu.Lock()
		defer mu.Unlock()
		onLost = append(onLost, cause)
	}})
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		time.Sleep(10 * time.Millisecond)
		return e.admin.Del(ctx, lease.Key()).Err()
	})
	require.ErrorIs(t, err, ErrLost)
	_, ends, notes := rec.snapshot()
	require.Len(t, notes, 1)
	assert.Equal(t, OpLost, notes[0].Op)
	assert.ErrorIs(t, notes[0].Err, ErrLost)
	assert.GreaterOrEqual(t, notes[0].Held, 10*time.Millisecond)
	assert.Equal(t, []string{"run"}, rec.ctxOps[OpLost])
	mu.Lock()
	assert.Len(t, onLost, 1, "OnLost")
	mu.Unlock()
	for _, e := range ends {
		if e.Op == OpRelease {
			assert.Equal(t, OutcomeNotHeld, e.Outcome)
			assert.Zero(t, e.Held, "the hold is counted once, with the loss")
		}
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, OutcomeOK},
		{&BusyError{Name: "x"}, OutcomeBusy},
		{errGone, OutcomeNotHeld},
		{lostBecause(errGone), OutcomeLost},
		{callError("x", errors.New("dial tcp: connection refused")), OutcomeUnavailable},
		{callError("x", testRedisError("NOAUTH Authentication required.")), OutcomeMisconfigured},
		{invalidf("bad"), OutcomeInvalid},
		{ctxEnded(canceledCtx(), "acquire"), OutcomeCancelled},
		{errors.New("work failed"), OutcomeFailed},
	} {
		assert.Equal(t, tc.want, OutcomeOf(tc.err), "%v", tc.err)
	}
}

func canceledCtx() context.Context {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	return c
}
