package fencegocron_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	fencegocron "github.com/fencelock/fencelock/gocron"
)

// env is one test's Redis: a client for the Lockers and one for checking
// keys, and a key prefix of the test's own.
type env struct {
	rdb, admin *redis.Client
	prefix     string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	addr := startRedis(t)
	e := &env{
		rdb:    redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}),
		admin:  redis.NewClient(&redis.Options{Addr: addr}),
		prefix: "fencegocron-test:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
	}
	t.Cleanup(func() { _ = e.rdb.Close(); _ = e.admin.Close() })
	return e
}

// locker returns a fencegocron Locker on a fencelock Locker of its own;
// t.Cleanup closes both.
func (e *env) locker(t *testing.T, fo *fencelock.Options, opts ...fencegocron.Option) *fencegocron.Locker {
	t.Helper()
	o := fencelock.Options{KeyPrefix: e.prefix}
	if fo != nil {
		o = *fo
		o.KeyPrefix = e.prefix
	}
	fl, err := fencelock.New(e.rdb, &o)
	require.NoError(t, err)
	l := fencegocron.NewLocker(fl, opts...)
	t.Cleanup(func() { _ = l.Close(); _ = fl.Close() })
	return l
}

func (e *env) held(t *testing.T, name string) bool {
	t.Helper()
	n, err := e.admin.Exists(t.Context(), e.prefix+"{"+name+"}").Result()
	require.NoError(t, err)
	return n == 1
}

func TestLockUnlock(t *testing.T) {
	e := newEnv(t)
	a, b := e.locker(t, nil), e.locker(t, nil)
	ctx := t.Context()

	lock, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	assert.True(t, e.held(t, "job"))

	_, err = b.Lock(context.WithoutCancel(ctx), "job")
	assert.ErrorIs(t, err, fencelock.ErrNotObtained, "another scheduler's Lock")

	require.NoError(t, lock.Unlock(ctx))
	assert.False(t, e.held(t, "job"), "released by Unlock")
	assert.ErrorIs(t, lock.Unlock(ctx), fencelock.ErrNotHeld, "a second Unlock")

	lock, err = b.Lock(ctx, "job")
	require.NoError(t, err, "free again")
	require.NoError(t, lock.Unlock(ctx))

	_, err = a.Lock(ctx, "bad{name}")
	assert.ErrorIs(t, err, fencelock.ErrInvalid)
}

// TestLockRefusesOverlappingRun checks that a job whose previous run on the
// same Locker has not returned is refused without asking Redis, and that
// other jobs are not.
func TestLockRefusesOverlappingRun(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, nil)
	jobCtx := context.WithoutCancel(t.Context()) // stands for gocron's job context

	lock, err := l.Lock(jobCtx, "job")
	require.NoError(t, err)
	// Make Redis say the lock is free: only the Locker's own record of the
	// run in progress can refuse the next Lock.
	require.NoError(t, e.admin.Del(t.Context(), e.prefix+"{job}").Err())
	_, err = l.Lock(jobCtx, "job")
	assert.ErrorIs(t, err, fencelock.ErrNotObtained)
	assert.ErrorContains(t, err, "previous run on this scheduler has not returned")

	other, err := l.Lock(jobCtx, "other-job")
	require.NoError(t, err, "another job")
	require.NoError(t, other.Unlock(jobCtx))

	assert.ErrorIs(t, lock.Unlock(jobCtx), fencelock.ErrNotHeld, "the lock was deleted under it")
	lock, err = l.Lock(jobCtx, "job")
	require.NoError(t, err, "after the run returned")
	require.NoError(t, lock.Unlock(jobCtx))
}

func TestUnlockOnCancelledContext(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	lock, err := l.Lock(ctx, "job")
	require.NoError(t, err)
	cancel() // gocron's shutdown cancels the job's context before Unlock
	require.NoError(t, lock.Unlock(ctx))
	assert.False(t, e.held(t, "job"))
}

func TestMinHold(t *testing.T) {
	e := newEnv(t)
	const hold = 300 * time.Millisecond
	l := e.locker(t, &fencelock.Options{TTL: 100 * time.Millisecond}, fencegocron.WithMinHold(hold))
	ctx := t.Context()

	lock, err := l.Lock(ctx, "job")
	require.NoError(t, err)
	locked := time.Now()
	require.NoError(t, lock.Unlock(ctx), "Unlock returns at once")
	// The hold outlasts the TTL several times: the watchdog renews it.
	time.Sleep(hold * 2 / 3)
	assert.True(t, e.held(t, "job"), "held before MinHold has passed")
	require.Eventually(t, func() bool { return !e.held(t, "job") }, 2*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(locked), hold, "released after MinHold")

	// A run longer than MinHold is released by Unlock itself.
	lock, err = l.Lock(ctx, "job")
	require.NoError(t, err)
	time.Sleep(hold)
	require.NoError(t, lock.Unlock(ctx))
	assert.False(t, e.held(t, "job"))
}

func TestCloseEndsMinHolds(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, nil, fencegocron.WithMinHold(time.Hour))
	ctx := t.Context()
	for _, job := range []string{"a", "b"} {
		lock, err := l.Lock(ctx, job)
		require.NoError(t, err)
		require.NoError(t, lock.Unlock(ctx))
		assert.True(t, e.held(t, job), "job %s in its minimum hold", job)
	}
	begin := time.Now()
	require.NoError(t, l.Close())
	assert.Less(t, time.Since(begin), time.Second, "Close")
	assert.False(t, e.held(t, "a"))
	assert.False(t, e.held(t, "b"))

	// After Close, locks are released by Unlock.
	lock, err := l.Lock(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))
	assert.False(t, e.held(t, "a"))
}

// jobResult is what a job's work saw.
type jobResult struct {
	fence int64
	cause error // the task context's cause when work saw it end
}

// runOnce runs task once, at once, as a job called "job" of s, and returns
// the error gocron handed to the AfterJobRunsWithError listener (nil when
// the run succeeded) or, if the run was skipped, to AfterLockError.
func runOnce(t *testing.T, s gocron.Scheduler, task gocron.Task, opts ...gocron.JobOption) error {
	t.Helper()
	done := make(chan error, 1)
	opts = append(opts, gocron.WithName("job"),
		gocron.WithEventListeners(
			gocron.AfterJobRuns(func(uuid.UUID, string) { done <- nil }),
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { done <- err }),
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { done <- err }),
		))
	_, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, opts...)
	require.NoError(t, err)
	s.Start()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not end within 10s")
		return nil
	}
}

func newScheduler(t *testing.T, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// TestTaskLost runs a job under a real gocron scheduler and deletes its lock
// in Redis, as an expiry and a takeover would: the watchdog's next renewal
// finds it gone, the task's context is cancelled with cause ErrLost, and the
// run's error, which gocron hands to AfterJobRunsWithError, matches ErrLost.
func TestTaskLost(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, &fencelock.Options{TTL: 150 * time.Millisecond})
	s := newScheduler(t, gocron.WithDistributedLocker(l))
	var got jobResult
	err := runOnce(t, s, l.Task(func(ctx context.Context, lease *fencelock.Lease) error {
		got.fence = lease.Fence()
		assert.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
		select {
		case <-ctx.Done():
			got.cause = context.Cause(ctx)
			return nil // the task adds the loss to the run's error
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled within 5s")
		}
	}))
	assert.Positive(t, got.fence)
	assert.ErrorIs(t, got.cause, fencelock.ErrLost)
	assert.ErrorIs(t, err, fencelock.ErrLost)
	require.NoError(t, s.Shutdown())
	assert.False(t, e.held(t, "job"))
}

// TestTaskJoinsWorkError checks that a run whose work failed after its lease
// was lost reports both.
func TestTaskJoinsWorkError(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, &fencelock.Options{TTL: 150 * time.Millisecond})
	s := newScheduler(t, gocron.WithDistributedLocker(l))
	errWork := errors.New("work failed")
	err := runOnce(t, s, l.Task(func(ctx context.Context, lease *fencelock.Lease) error {
		assert.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
		<-ctx.Done()
		return errWork
	}))
	assert.ErrorIs(t, err, errWork)
	assert.ErrorIs(t, err, fencelock.ErrLost)
	assert.NotContains(t, err.Error(), "\n")
}

// TestTaskHeld checks a run that keeps its lock: work gets a lease that
// holds the lock, its context ends only when the run does, and the lock is
// released after it.
func TestTaskHeld(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, &fencelock.Options{TTL: 100 * time.Millisecond})
	s := newScheduler(t, gocron.WithDistributedLocker(l))
	var held bool
	var ctxErr error
	err := runOnce(t, s, l.Task(func(ctx context.Context, lease *fencelock.Lease) error {
		time.Sleep(300 * time.Millisecond) // three TTLs: renewed meanwhile
		held = e.held(t, "job") && time.Now().Before(lease.Deadline())
		ctxErr = ctx.Err()
		return nil
	}))
	require.NoError(t, err)
	assert.True(t, held, "held while the work ran")
	assert.NoError(t, ctxErr)
	require.NoError(t, s.Shutdown())
	assert.False(t, e.held(t, "job"))
}

// TestTaskWithoutLock checks that a Task whose run took no lock of its
// Locker does not run its work.
func TestTaskWithoutLock(t *testing.T) {
	e := newEnv(t)
	l, other := e.locker(t, nil), e.locker(t, nil)
	tests := []struct {
		name  string
		sched []gocron.SchedulerOption
		job   []gocron.JobOption
	}{
		{name: "no locker"},
		{name: "another locker", sched: []gocron.SchedulerOption{gocron.WithDistributedLocker(other)}},
		{name: "locker disabled for the job", sched: []gocron.SchedulerOption{gocron.WithDistributedLocker(l)},
			job: []gocron.JobOption{gocron.WithDisabledDistributedJobLocker(true)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ran atomic.Bool
			s := newScheduler(t, tt.sched...)
			err := runOnce(t, s, l.Task(func(context.Context, *fencelock.Lease) error {
				ran.Store(true)
				return nil
			}), tt.job...)
			assert.ErrorIs(t, err, fencelock.ErrInvalid)
			assert.ErrorContains(t, err, "holds no lock of this Locker")
			assert.False(t, ran.Load(), "work ran")
		})
	}
}

// TestTaskDefaultName checks that a Locker.Task job without gocron.WithName
// is refused: gocron names it after the function of its task, which is
// Task's closure for every such job, so that they would all share one lock.
// Lock refuses that name without asking Redis (here, one nobody listens on:
// asking it would fail with ErrUnavailable), and gocron skips the run.
func TestTaskDefaultName(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	fl, err := fencelock.New(rdb, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = fl.Close() })
	l := fencegocron.NewLocker(fl)
	s := newScheduler(t, gocron.WithDistributedLocker(l))

	var ran atomic.Bool
	work := func(context.Context, *fencelock.Lease) error {
		ran.Store(true)
		return nil
	}
	skipped := make(chan error, 1)
	var names []string
	for range 2 { // two jobs made at one call site
		job, err := s.NewJob(gocron.DurationJob(time.Hour), l.Task(work))
		require.NoError(t, err)
		names = append(names, job.Name())
	}
	job, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), l.Task(work),
		gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { skipped <- err })))
	require.NoError(t, err)
	names = append(names, job.Name())
	assert.Equal(t, []string{names[0], names[0], names[0]}, names, "gocron's default names of Task jobs")

	_, err = l.Lock(t.Context(), names[0])
	assert.ErrorIs(t, err, fencelock.ErrInvalid, "Lock of the default name")
	assert.ErrorContains(t, err, "gocron.WithName")

	s.Start()
	select {
	case err = <-skipped:
		assert.ErrorIs(t, err, fencelock.ErrInvalid, "the run's lock error")
	case <-time.After(10 * time.Second):
		t.Fatal("the run was not skipped within 10s")
	}
	assert.False(t, ran.Load(), "work ran")
}

// TestJobLocker checks the Locker given to one job (WithDistributedJobLocker)
// rather than to the scheduler.
func TestJobLocker(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, nil)
	s := newScheduler(t)
	var fence int64
	err := runOnce(t, s, l.Task(func(_ context.Context, lease *fencelock.Lease) error {
		fence = lease.Fence()
		return nil
	}), gocron.WithDistributedJobLocker(l))
	require.NoError(t, err)
	assert.Positive(t, fence)
}

// TestBusyLockSkipsRun checks that gocron skips a run whose lock another
// scheduler holds, and reports ErrNotObtained to AfterLockError.
func TestBusyLockSkipsRun(t *testing.T) {
	e := newEnv(t)
	l, other := e.locker(t, nil), e.locker(t, nil)
	lock, err := other.Lock(t.Context(), "job")
	require.NoError(t, err)
	defer func() { _ = lock.Unlock(t.Context()) }()
	s := newScheduler(t, gocron.WithDistributedLocker(l))
	var ran atomic.Bool
	err = runOnce(t, s, l.Task(func(context.Context, *fencelock.Lease) error {
		ran.Store(true)
		return nil
	}))
	assert.ErrorIs(t, err, fencelock.ErrNotObtained)
	assert.False(t, ran.Load())
}

func TestMisuse(t *testing.T) {
	assert.PanicsWithValue(t, "fencegocron: nil fencelock.Locker", func() { fencegocron.NewLocker(nil) })
	assert.PanicsWithValue(t, "fencegocron: WithMinHold -1s is negative", func() { fencegocron.WithMinHold(-time.Second) })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	fl, err := fencelock.New(rdb, nil)
	require.NoError(t, err)
	defer fl.Close()
	assert.PanicsWithValue(t, "fencegocron: nil Option", func() { fencegocron.NewLocker(fl, nil) })
	assert.PanicsWithValue(t, "fencegocron: nil work function", func() { fencegocron.NewLocker(fl).Task(nil) })

	var zero fencegocron.Locker
	_, err = zero.Lock(t.Context(), "job")
	assert.ErrorIs(t, err, fencelock.ErrInvalid, "the zero Locker's Lock")
	assert.NoError(t, zero.Close())
}
