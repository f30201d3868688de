package tasks

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// realClock is the time package's, which synctest's bubble fakes.
type realClock struct{}

func (realClock) Now() time.Time                       { return time.Now() }
func (realClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

var errFinal = errors.New("final")

func newGroup() *Group {
	return New(realClock{}, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(err error) bool { return errors.Is(err, errFinal) })
}

// running returns how many goroutines g tracks.
func running(g *Group) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

func TestCallWithoutStopRunsOnTheCaller(t *testing.T) {
	g := newGroup()
	res, done := Call(g, nil, nil, func() int { return 7 }, nil)
	assert.True(t, done)
	assert.Equal(t, 7, res)
	assert.Zero(t, running(g), "no goroutine")
}

func TestCallReturnsItsResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		stop := make(chan struct{})
		res, done := Call(g, stop, nil, func() int { time.Sleep(time.Second); return 7 }, nil)
		assert.True(t, done)
		assert.Equal(t, 7, res)
		g.Close(time.Now().Add(time.Minute))
		synctest.Wait()
		assert.Zero(t, running(g), "the worker ended with Close")
	})
}

// A call whose caller has gone returns once a stop channel closes (after
// the grace), and its result goes to late when f ends; Close waits for it.
func TestCallReturnsAtStopAndHandsTheResultOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		stop := make(chan struct{})
		release := make(chan struct{})
		var late atomic.Int64
		time.AfterFunc(100*time.Millisecond, func() { close(stop) })
		start := time.Now()
		_, done := Call(g, nil, stop, func() int { <-release; return 7 },
			func(res int) { late.Store(int64(res)) })
		assert.False(t, done)
		assert.Equal(t, 100*time.Millisecond+grace, time.Since(start), "the stop, then the grace")
		assert.Zero(t, late.Load(), "f still runs")

		closed := make(chan struct{})
		go func() { g.Close(time.Now().Add(time.Minute)); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while f ran")
		default:
		}
		close(release)
		<-closed
		assert.Equal(t, int64(7), late.Load(), "late got the result")
	})
}

// A result that comes within the grace is the caller's, not late's.
func TestCallTakesAResultWithinTheGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		stop := make(chan struct{})
		close(stop)
		lateCalled := false
		res, done := Call(g, stop, nil, func() int { time.Sleep(grace / 2); return 7 },
			func(int) { lateCalled = true })
		assert.True(t, done)
		assert.Equal(t, 7, res)
		g.Close(time.Now().Add(time.Minute))
		assert.False(t, lateCalled)
	})
}

// A burst of calls leaves at most MaxIdlers workers, and they end after
// workerIdle without work.
func TestWorkersIdleThenEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		stop := make(chan struct{})
		release := make(chan struct{})
		results := make(chan bool, 3*MaxIdlers)
		for range 3 * MaxIdlers {
			go func() {
				_, done := Call(g, stop, nil, func() int { <-release; return 1 }, nil)
				results <- done
			}()
		}
		synctest.Wait()
		assert.Equal(t, 3*MaxIdlers, running(g), "one worker per call in flight")
		close(release)
		for range 3 * MaxIdlers {
			assert.True(t, <-results)
		}
		synctest.Wait()
		assert.Equal(t, MaxIdlers, running(g), "MaxIdlers wait for work")

		_, done := Call(g, stop, nil, func() int { return 1 }, nil)
		assert.True(t, done)
		synctest.Wait()
		assert.Equal(t, MaxIdlers, running(g), "an idle worker took the call")

		time.Sleep(workerIdle)
		synctest.Wait()
		assert.Zero(t, running(g), "idle workers end")
	})
}

func TestGiveBackRetriesUntilDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		var tries atomic.Int32
		g.GiveBack("release", "a", time.Minute, func(ctx context.Context) (bool, error) {
			deadline, ok := ctx.Deadline()
			assert.True(t, ok)
			assert.Equal(t, time.Second, time.Until(deadline), "each try is bounded by the timeout")
			if tries.Add(1) < 3 {
				return false, errors.New("connection refused")
			}
			return true, nil
		})
		synctest.Wait()
		time.Sleep(10 * time.Second) // more than two backoffs
		synctest.Wait()
		assert.Equal(t, int32(3), tries.Load())
		assert.Zero(t, running(g), "done")
	})
}

func TestGiveBackStopsAtAFinalError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		var tries atomic.Int32
		g.GiveBack("release", "a", time.Minute, func(context.Context) (bool, error) {
			tries.Add(1)
			return false, errFinal
		})
		synctest.Wait()
		assert.Equal(t, int32(1), tries.Load())
		assert.Zero(t, running(g))
	})
}

// The tries end once the lock has expired (until, or the timeout when
// that is longer).
func TestGiveBackEndsWithTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		start := time.Now()
		var last atomic.Int64
		g.GiveBack("release", "a", 5*time.Second, func(context.Context) (bool, error) {
			last.Store(int64(time.Since(start)))
			return false, errors.New("connection refused")
		})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.NotZero(t, running(g), "still trying before the lock expires")
		time.Sleep(2 * time.Second) // the last pause is at most a second
		synctest.Wait()
		assert.Zero(t, running(g), "ended after the lock expired")
		assert.GreaterOrEqual(t, time.Duration(last.Load()), 5*time.Second, "the last try came when the lock had expired")
	})
}

func TestCloseStopsGiveBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		var tries atomic.Int32
		g.GiveBack("release", "a", time.Hour, func(context.Context) (bool, error) {
			tries.Add(1)
			return false, errors.New("connection refused")
		})
		synctest.Wait()
		start := time.Now()
		g.Close(time.Now().Add(time.Minute))
		assert.Zero(t, time.Since(start), "the pause ended at Close")
		assert.Zero(t, running(g))
		assert.Equal(t, int32(1), tries.Load())
	})
}

// Close waits until by at most for a goroutine that does not end.
func TestCloseWaitsUntilByAtMost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		release := make(chan struct{})
		g.Go(func(<-chan struct{}) { <-release })
		start := time.Now()
		g.Close(start.Add(3 * time.Second))
		assert.Equal(t, 3*time.Second, time.Since(start))
		assert.Equal(t, 1, running(g), "still running, ends with its call")
		close(release)
		synctest.Wait()
		assert.Zero(t, running(g))
	})
}

func TestGoStopsAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup()
		stopped := false
		g.Go(func(stop <-chan struct{}) { <-stop; stopped = true })
		g.Close(time.Now().Add(time.Minute))
		assert.True(t, stopped)
		g.Close(time.Now().Add(time.Minute)) // twice is fine
	})
}

func TestTurnKeepsOrderAndEndsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var turn Turn
		require.NoError(t, turn.Lock(context.Background()))

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		assert.ErrorIs(t, turn.Lock(ctx), context.DeadlineExceeded, "held: Lock ends with its context")
		assert.Equal(t, time.Second, time.Since(start))

		got := make(chan struct{})
		go func() {
			assert.NoError(t, turn.Lock(context.Background()))
			close(got)
		}()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("the turn was taken twice")
		default:
		}
		turn.Unlock()
		<-got
		turn.Unlock()
		require.NoError(t, turn.Lock(context.Background()), "free again")
	})
}

func TestTurnUncontendedAllocatesNothing(t *testing.T) {
	var turn Turn
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		_ = turn.Lock(ctx)
		turn.Unlock()
	})
	assert.Zero(t, allocs)
}
