package fencegocron_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// shutdownTTL is the TTL of the shutdown tests' locks: they check that a
// lock stays held over several of them, renewed, after gocron cancelled
// the job's context.
const shutdownTTL = 100 * time.Millisecond

// stops are the two ways gocron cancels a job's context while its function
// may still run.
var stops = []struct {
	name string
	stop func(s gocron.Scheduler, id uuid.UUID) error
}{
	{"shutdown", func(s gocron.Scheduler, _ uuid.UUID) error { return s.Shutdown() }},
	{"job removed", func(s gocron.Scheduler, id uuid.UUID) error { return s.RemoveJob(id) }},
}

// inspector returns a fencelock Locker of its own on the test's Redis, as
// another pod would have, to look at the job's lock.
func (e *env) inspector(t *testing.T) *fencelock.Locker {
	t.Helper()
	fl, err := fencelock.New(e.rdb, &fencelock.Options{KeyPrefix: e.prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = fl.Close() })
	return fl
}

// assertHeldWhileRunning checks, over several TTLs, that the lock called
// name is held with the fence fence (0: any), and that another Locker cannot
// take it.
func assertHeldWhileRunning(t *testing.T, other *fencelock.Locker, name string, fence int64) {
	t.Helper()
	begin := time.Now()
	for end := begin.Add(3 * shutdownTTL); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		info, err := other.Inspect(t.Context(), name)
		require.NoError(t, err)
		require.True(t, info.Held, "the lock is released %v after the job's context ended, while the job still runs",
			time.Since(begin))
		if fence != 0 {
			require.Equal(t, fence, info.Fence, "the lock's holding while the job still runs")
		}
	}
	_, err := other.Acquire(t.Context(), name)
	require.ErrorIs(t, err, fencelock.ErrNotObtained, "another pod's Acquire while the job still runs")
}

// TestShutdownKeepsLockWhileJobRuns runs a plain gocron job under the
// Locker and stops it (scheduler shutdown, job removed) while it runs: gocron
// cancels the job's context, and the lock stays held, renewed, until the job
// function returns and gocron calls Unlock.
func TestShutdownKeepsLockWhileJobRuns(t *testing.T) {
	for _, tt := range stops {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			l := e.locker(t, &fencelock.Options{TTL: shutdownTTL})
			other := e.inspector(t)
			s := newScheduler(t, gocron.WithDistributedLocker(l))
			cancelled, finish, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
			letFinish := sync.OnceFunc(func() { close(finish) })
			defer letFinish() // also when the test fails: the job must return
			job, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
				gocron.NewTask(func(ctx context.Context) {
					<-ctx.Done()
					close(cancelled)
					<-finish // the job goes on after its context ended
				}),
				gocron.WithName("job"),
				gocron.WithEventListeners(gocron.AfterJobRuns(func(uuid.UUID, string) { close(ended) })))
			require.NoError(t, err)
			s.Start()
			require.Eventually(t, func() bool { return e.held(t, "job") }, 5*time.Second, 5*time.Millisecond, "the run took the lock")

			stopped := make(chan error, 1)
			go func() { stopped <- tt.stop(s, job.ID()) }()
			select {
			case <-cancelled:
			case <-time.After(5 * time.Second):
				t.Fatal("the job's context was not cancelled within 5s")
			}
			assertHeldWhileRunning(t, other, "job", 0)

			letFinish()
			<-ended
			require.NoError(t, <-stopped)
			require.Eventually(t, func() bool { return !e.held(t, "job") }, 5*time.Second, 5*time.Millisecond,
				"released after the job returned")
		})
	}
}

// TestShutdownTaskKeepsLockUntilWorkReturns stops a Locker.Task job while
// its work runs: the work's context is cancelled with gocron's cause (not
// ErrLost), and the lock stays held, with the same fence, until the work
// returns.
func TestShutdownTaskKeepsLockUntilWorkReturns(t *testing.T) {
	for _, tt := range stops {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			l := e.locker(t, &fencelock.Options{TTL: shutdownTTL})
			other := e.inspector(t)
			s := newScheduler(t, gocron.WithDistributedLocker(l))
			started, finish := make(chan int64, 1), make(chan struct{})
			letFinish := sync.OnceFunc(func() { close(finish) })
			defer letFinish() // also when the test fails: the work must return
			cause := make(chan error, 1)
			ended := make(chan error, 1)
			job, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
				l.Task(func(ctx context.Context, lease *fencelock.Lease) error {
					started <- lease.Fence()
					<-ctx.Done()
					cause <- context.Cause(ctx)
					<-finish // the work goes on after its context ended
					return nil
				}),
				gocron.WithName("job"),
				gocron.WithEventListeners(
					gocron.AfterJobRuns(func(uuid.UUID, string) { ended <- nil }),
					gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { ended <- err })))
			require.NoError(t, err)
			s.Start()
			var fence int64
			select {
			case fence = <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("the work did not start within 5s")
			}

			stopped := make(chan error, 1)
			go func() { stopped <- tt.stop(s, job.ID()) }()
			var got error
			select {
			case got = <-cause:
			case <-time.After(5 * time.Second):
				t.Fatal("the work's context was not cancelled within 5s")
			}
			assert.ErrorIs(t, got, context.Canceled, "the work context's cause")
			assert.False(t, errors.Is(got, fencelock.ErrLost), "the work context's cause %v matches ErrLost", got)
			assertHeldWhileRunning(t, other, "job", fence)

			letFinish()
			assert.NoError(t, <-ended, "the run's error")
			require.NoError(t, <-stopped)
			require.Eventually(t, func() bool { return !e.held(t, "job") }, 5*time.Second, 5*time.Millisecond,
				"released after the work returned")
		})
	}
}
