package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
)

var ctx = context.Background()

func TestAcquireRelease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)

	before := time.Now()
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, name, lease.Name())
	assert.Equal(t, "lock:{"+name+"}", lease.Key())
	assert.Len(t, lease.Token(), 36)
	assert.Positive(t, lease.Fence())

	got, err := e.admin.Get(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Equal(t, lease.Token()+" "+strconv.FormatInt(lease.Fence(), 10)+" "+l.opts.Owner, got,
		"the lock key holds the token, the fence and the owner")
	pttl, err := e.admin.PTTL(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assertTTLLeft(t, pttl, 10*time.Second, before)

	require.NoError(t, lease.Release(ctx))
	n, err := e.admin.Exists(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Release deletes the lock")
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld, "second Release")
	assert.ErrorIs(t, lease.Extend(ctx, time.Second), ErrNotHeld, "Extend after Release")
	assert.False(t, lease.Deadline().After(time.Now()), "Deadline after Release has passed")
}

func TestAcquireBusy(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)

	before := time.Now()
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, name, WithOwner("another pod"))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.NotErrorIs(t, err, ErrUnavailable)
	var busy *BusyError
	require.ErrorAs(t, err, &busy, "the details, as a typed error")
	assert.Equal(t, name, busy.Name)
	assert.Equal(t, l.opts.Owner, busy.Owner, "the holder's owner, not the caller's")
	assertTTLLeft(t, busy.TTL, 30*time.Second, before)
	assert.Equal(t, `fencelock: not obtained: "`+name+`" held by `+l.opts.Owner+" for "+
		busy.TTL.Round(100*time.Millisecond).String()+" more", err.Error()) // "30s", read at once

	// A different name is independent.
	other, err := l.Acquire(ctx, name+"-other")
	require.NoError(t, err)
	require.NoError(t, other.Release(ctx))
	require.NoError(t, held.Release(ctx))

	again, err := l.Acquire(ctx, name)
	require.NoError(t, err, "free again after Release")
	require.NoError(t, again.Release(ctx))
}

func TestOneRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	// Warm the script cache so EVALSHA does not fall back to EVAL.
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	require.NoError(t, lease.Extend(ctx, time.Minute))
	require.NoError(t, lease.Release(ctx))

	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"acquire", func() (err error) { lease, err = l.Acquire(ctx, uniqueName(t)); return err }},
		{"extend", func() error { return lease.Extend(ctx, time.Minute) }},
		{"release", func() error { return lease.Release(ctx) }},
	} {
		before := e.hook.calls.Load()
		require.NoError(t, step.do(), step.name)
		assert.Equal(t, int64(1), e.hook.calls.Load()-before, "%s: Redis commands", step.name)
	}
}

func TestFenceStrictlyIncreasing(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)

	var last int64
	next := func(what string) {
		t.Helper()
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		assert.Greater(t, lease.Fence(), last, what)
		last = lease.Fence()
		require.NoError(t, lease.Release(ctx))
	}
	for i := range 20 {
		next("acquisition " + strconv.Itoa(i))
	}

	// The counter is lost: deleted, flushed.
	_, fenceKey := l.keys(name)
	require.NoError(t, e.admin.Del(ctx, fenceKey).Err())
	next("after the counter was deleted")
	next("after that")
	require.NoError(t, e.admin.FlushAll(ctx).Err())
	next("after FLUSHALL")

	// The counter ahead of the server's clock is incremented, not floored,
	// exactly also beyond 2^53 where Lua's doubles would repeat values.
	for _, start := range []int64{8000000000000000, 1 << 53, 1<<62 + 1} {
		require.NoError(t, e.admin.Set(ctx, fenceKey, start, 0).Err())
		for i := range int64(3) {
			lease, err := l.Acquire(ctx, name)
			require.NoError(t, err)
			assert.Equal(t, start+1+i, lease.Fence())
			require.NoError(t, lease.Release(ctx))
		}
	}
}

func TestFenceFlooredByServerTime(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)

	before, err := e.admin.Time(ctx).Result()
	require.NoError(t, err)
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	after, err := e.admin.Time(ctx).Result()
	require.NoError(t, err)

	assert.GreaterOrEqual(t, lease.Fence(), before.UnixMicro(), "fence is at least the server's TIME before")
	assert.LessOrEqual(t, lease.Fence(), after.UnixMicro(), "a new counter's fence is the server's TIME")
	_, fenceKey := l.keys(lease.Name())
	stored, err := e.admin.Get(ctx, fenceKey).Int64()
	require.NoError(t, err)
	assert.Equal(t, lease.Fence(), stored, "the counter keeps the last fence")
	require.NoError(t, lease.Release(ctx))
}

func TestFenceCounterMemory(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	// The documented cost: 50 to 150 bytes per name, growing with its
	// length (56 and 88 bytes for these two on Redis 7.0).
	var sizes []int64
	for _, name := range []string{"a", "settlement:2026-11-30", strings.Repeat("n", 60)} {
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
		_, fenceKey := l.keys(name)
		n, err := e.admin.MemoryUsage(ctx, fenceKey).Result()
		require.NoError(t, err)
		t.Logf("MEMORY USAGE %s = %d bytes", fenceKey, n)
		assert.GreaterOrEqual(t, n, int64(50))
		assert.LessOrEqual(t, n, int64(150))
		sizes = append(sizes, n)
		ttl, err := e.admin.PTTL(ctx, fenceKey).Result()
		require.NoError(t, err)
		assert.InDelta(t, time.Hour, ttl, float64(time.Minute), "the counter expires after FenceRetention")
	}
	assert.Less(t, sizes[0], sizes[2], "longer names cost more")
}

func TestConcurrentFencesUnique(t *testing.T) {
	e := newEnv(t, nil)
	name := uniqueName(t)
	const workers, rounds = 8, 25

	var (
		inside  atomic.Int32
		overlap atomic.Int32
		mu      sync.Mutex
		fences  []int64 // in the order the critical sections ran
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			l, err := New(e.srv.Client(nil), nil) // a client per "pod"
			if err != nil {
				errs <- err
				return
			}
			defer l.Close()
			for range rounds {
				lease, err := l.Acquire(ctx, name, WithWait(10*time.Second))
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) > 1 {
					overlap.Add(1)
				}
				mu.Lock()
				fences = append(fences, lease.Fence())
				mu.Unlock()
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, overlap.Load(), "overlapping holders")
	require.Len(t, fences, workers*rounds)
	for i := 1; i < len(fences); i++ {
		assert.Greater(t, fences[i], fences[i-1], "fence %d in acquisition order", i)
	}
}

func TestRetryAfterLostReplyIsIdempotent(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	key, fenceKey := l.keys(uniqueName(t))

	// The script itself: a second attempt with the same token (the first
	// reply was lost) finds the lock its own and returns the same fence.
	run := func(token string) []any {
		t.Helper()
		reply, err := runScript(script.Acquire, ctx, e.admin, []string{key, key + ":t:" + token, fenceKey, key + ":q", key + ":qi"},
			token, 5000, 60000, "pod", "0", 2000).Slice()
		require.NoError(t, err)
		return reply
	}
	before := time.Now()
	first := run("token-a")
	second := run("token-a")
	assert.Equal(t, int64(1), first[0])
	assert.Equal(t, first, second, "retry with the same token")
	busy := run("token-b")
	assert.Equal(t, int64(0), busy[0], "another token is refused")
	pttl, _ := busy[1].(int64)
	assertTTLLeft(t, time.Duration(pttl)*time.Millisecond, 5*time.Second, before, "and told the holder's PTTL")

	// Through Acquire: the first reply is lost after the server applied it.
	var (
		dropped   atomic.Int32
		lostFence atomic.Int64 // the fence in the reply that was lost
	)
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" && dropped.Add(1) == 1 {
			if _, fence, _, err := decodeAcquire(cmd.(*redis.Cmd).Val()); err == nil {
				lostFence.Store(fence)
			}
			return errReplyLost
		}
		return nil
	})
	// Trying once: the error is returned, and the lock that the attempt took
	// is given back.
	name2 := uniqueName(t) + "-once"
	_, err := l.Acquire(ctx, name2)
	require.ErrorIs(t, err, ErrUnavailable, "a lost reply is an error")
	require.ErrorIs(t, err, errReplyLost)
	k2, _ := l.keys(name2)
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, k2).Result()
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "the lock taken by the attempt whose reply was lost is given back")

	// Waiting: the next attempt of the same call finds the lock its own and
	// succeeds with the fence that the lost attempt issued.
	dropped.Store(0)
	lease, err := l.Acquire(ctx, uniqueName(t)+"-wait", WithWait(time.Second))
	require.NoError(t, err)
	assert.Equal(t, int32(2), dropped.Load(), "two attempts")
	require.Positive(t, lostFence.Load())
	assert.Equal(t, lostFence.Load(), lease.Fence(), "the fence of the lost reply: one fence issued, not two")
	require.NoError(t, lease.Release(ctx))
}

// Issue 13: an acquire that go-redis's auto-pipeliner sent in a batch whose
// reply was lost after the server applied it is resent, and is still
// idempotent. The script is run here directly; a Locker made with
// New(client.AutoPipeline()) is in the same case (issue 29, see
// autopipeline_test.go): the pipeliner
// dispatches a batch as a pipeline (a lone command as a pipeline of one, on
// its own goroutine), and go-redis retries a pipeline whose connection
// broke (io.EOF) on a new connection, up to MaxRetries, by itself: the
// caller sees the retry's reply only.
func TestAutoPipelinedRetryAfterLostBatchIsIdempotent(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	proxy := redistest.StartProxy(t, e.srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // MaxRetries 3
	t.Cleanup(func() { _ = client.Close() })
	ap, err := client.AutoPipeline()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ap.Close() })
	require.True(t, ap.IsBlocking(), "each call waits for its reply")

	type lock struct{ key, fenceKey string }
	newLock := func(suffix string) lock {
		key, fenceKey := l.keys(uniqueName(t) + suffix)
		return lock{key, fenceKey}
	}
	run := func(k lock, token string) ([]any, error) {
		return runScript(script.Acquire, ctx, ap, []string{k.key, k.key + ":t:" + token, k.fenceKey, k.key + ":q", k.key + ":qi"},
			token, 60000, 60000, "pod", "0", 2000).Slice()
	}
	// The fence the server issued for k: in the lock's value, and the
	// counter's, as one fence was issued.
	stored := func(k lock, token string) string {
		t.Helper()
		v, err := e.admin.Get(ctx, k.key).Result()
		require.NoError(t, err)
		holder, fence, _ := keys.Parse(v)
		require.Equal(t, token, holder, "%s is held by the token", k.key)
		counter, err := e.admin.Get(ctx, k.fenceKey).Int64()
		require.NoError(t, err)
		require.Equal(t, fence, counter, "%s: one fence issued", k.key)
		return strconv.FormatInt(fence, 10)
	}
	evalshas := func() int { // EVALSHA commands the server ran
		t.Helper()
		stat, ok := e.srv.Info("commandstats")["cmdstat_evalsha"]
		if !ok {
			return 0
		}
		var n int
		_, err := fmt.Sscanf(stat, "calls=%d,", &n)
		require.NoError(t, err, stat)
		return n
	}

	// EVALSHA must find the script, or the batch the drop hits would be a
	// NOSCRIPT that took no effect; and the pipeliner's pooled connection
	// must be dialled already, or the drop would hit the dial's HELLO
	// (DropNextReply). Only the pipeliner's traffic goes through the proxy.
	require.NoError(t, loadScript(script.Acquire, ctx, e.admin).Err())
	require.NoError(t, ap.Ping(ctx).Err())
	before := evalshas()

	// One caller: its batch is its acquire alone.
	a := newLock("-one")
	proxy.DropNextReply()
	reply, err := run(a, "token-a")
	require.NoError(t, err, "the pipeliner resent the batch whose reply was lost")
	require.Equal(t, 2, evalshas()-before, "the server ran the acquire twice: the run whose reply was lost, and the retry")
	assert.Equal(t, []any{int64(1), stored(a, "token-a")}, reply, "the retry returns the lost run's fence")
	busy, err := run(a, "token-b")
	require.NoError(t, err)
	assert.Equal(t, int64(0), busy[0], "another token is refused")

	// Concurrent callers, whose acquires the pipeliner batches: the first
	// batch's reply is lost, and every acquire in it is resent.
	const callers = 8
	locks := make([]lock, callers)
	replies := make([][]any, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	before = evalshas()
	proxy.DropNextReply()
	for i := range locks {
		locks[i] = newLock("-" + strconv.Itoa(i))
		wg.Go(func() { replies[i], errs[i] = run(locks[i], "token-"+strconv.Itoa(i)) })
	}
	wg.Wait()
	for i, k := range locks {
		require.NoError(t, errs[i], "caller %d", i)
		assert.Equal(t, []any{int64(1), stored(k, "token-"+strconv.Itoa(i))}, replies[i], "caller %d", i)
	}
	resent := evalshas() - before - callers
	t.Logf("%d of the %d concurrent acquires ran twice: the batch they were in lost its reply and was resent", resent, callers)
	assert.Positive(t, resent, "a batch was resent")
}

func TestGoRedisRetryAfterLostReply(t *testing.T) {
	// go-redis retries a command whose connection broke (MaxRetries). The
	// retry resends the script with the same token and must succeed.
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	var once atomic.Bool
	// Apply the script, then make the hook call it once more, as go-redis's
	// retry would after a lost reply: the second run's reply is the one
	// returned.
	warm, err := l.Acquire(ctx, name+"-warm") // cache the script: EVALSHA succeeds
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	h := &resendHook{once: &once}
	e.client.AddHook(h)

	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "the resent acquire is not locked out by its own lock")
	require.True(t, once.Load(), "the acquire was resent")
	require.Positive(t, h.firstFence)
	assert.Equal(t, h.firstFence, lease.Fence(), "the fence of the first, lost reply: one fence issued, not two")
	require.NoError(t, lease.Release(ctx))
}

// resendHook sends the first acquire script twice and returns the second
// reply, as a client retrying after a lost reply does.
type resendHook struct {
	once       *atomic.Bool
	firstFence int64 // the fence in the first reply; written before the resend
}

func (h *resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" && h.once.CompareAndSwap(false, true) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
			_, h.firstFence, _, _ = decodeAcquire(cmd.(*redis.Cmd).Val())
		}
		return next(ctx, cmd)
	}
}

func TestCancelledAcquireLeavesNothingHeld(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)

	// The request reaches the server and takes the lock; the caller's
	// context ends before the reply arrives.
	cctx, cancel := context.WithCancel(ctx)
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" {
			cancel()
			return context.Canceled
		}
		return nil
	})
	_, err := l.Acquire(cctx, name)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrNotObtained, "no verdict: the reply never arrived")
	assert.NotErrorIs(t, err, ErrUnavailable)
	key, _ := l.keys(name)
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, key).Result()
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "the lock is not left held after a cancelled Acquire")
	require.NoError(t, l.Close(), "the clean-up is done when Close returns")
}

func TestReleaseTakenOver(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)

	old, err := l.Acquire(ctx, name, WithTTL(50*time.Millisecond))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, old.Key()).Result()
		return err == nil && n == 0
	}, 5*time.Second, 5*time.Millisecond, "the lock expires")

	current, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Greater(t, current.Fence(), old.Fence())

	assert.ErrorIs(t, old.Extend(ctx, time.Minute), ErrNotHeld, "Extend of a taken-over lock")
	assert.ErrorIs(t, old.Release(ctx), ErrNotHeld, "Release of a taken-over lock")
	got, err := e.admin.Get(ctx, current.Key()).Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(got, current.Token()+" "), "the other holder's lock is left alone")
	pttl, err := e.admin.PTTL(ctx, current.Key()).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 20*time.Second, "and its TTL untouched")
	require.NoError(t, current.Release(ctx))
}

func TestExtend(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(time.Second))
	require.NoError(t, err)

	before := time.Now()
	require.NoError(t, lease.Extend(ctx, time.Minute))
	after := time.Now()
	pttl, err := e.admin.PTTL(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assertTTLLeft(t, pttl, time.Minute, before)
	// The deadline counts from the Extend's send time, less the drift.
	assert.False(t, lease.Deadline().Before(before.Add(time.Minute-drift(time.Minute))), "deadline %v", lease.Deadline())
	assert.False(t, lease.Deadline().After(after.Add(time.Minute-drift(time.Minute))), "deadline %v", lease.Deadline())

	// Deleted from outside: Extend finds it gone and does not recreate it.
	require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
	assert.ErrorIs(t, lease.Extend(ctx, time.Minute), ErrNotHeld)
	n, err := e.admin.Exists(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Extend never recreates the lock")
	assert.False(t, lease.Deadline().After(time.Now()))
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)
}

func TestDeadline(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	// A fake clock that a round trip moves by one second: the deadline must
	// come from the reading taken before the request was sent, not after the
	// reply arrived.
	var clock atomic.Int64
	base := time.Now()
	l.clock = fakeNow(func() time.Time { return base.Add(time.Duration(clock.Load())) })
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) != "" {
			clock.Add(int64(time.Second))
		}
		return nil
	})

	lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, base.Add(10*time.Second-100*time.Millisecond-2*time.Millisecond), lease.Deadline())

	require.NoError(t, lease.Extend(ctx, 20*time.Second))
	sent := base.Add(time.Second)
	assert.Equal(t, sent.Add(20*time.Second-200*time.Millisecond-2*time.Millisecond), lease.Deadline())
	require.NoError(t, lease.Release(ctx))
}

func TestExtendUnknownOutcomeKeepsDeadlineConservative(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(time.Minute))
	require.NoError(t, err)

	// A shorter TTL is applied but its reply lost: the server now expires
	// the lock sooner, and Deadline must not claim the old, later time.
	e.hook.set(nil, onScript("extend", errReplyLost))
	err = lease.Extend(ctx, time.Second)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.True(t, lease.Deadline().Before(time.Now().Add(time.Second)), "deadline moved down to the shorter TTL")

	// A longer TTL with a lost reply leaves the old deadline.
	e.hook.set(nil, nil)
	require.NoError(t, lease.Extend(ctx, time.Minute))
	before := lease.Deadline()
	e.hook.set(nil, onScript("extend", errReplyLost))
	require.ErrorIs(t, lease.Extend(ctx, 2*time.Minute), ErrUnavailable)
	assert.Equal(t, before, lease.Deadline())
	e.hook.set(nil, nil)
	require.NoError(t, lease.Release(ctx))
}

func TestWaitObtainsAfterRelease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)

	got := waitInBackground(l, name)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 10*time.Second, "the waiter did not get the released lock")
}

func TestWaitSleepsNoLongerThanHolderTTL(t *testing.T) {
	e := newEnv(t, nil)
	// A backoff far longer than the holder's remaining TTL: the waiter must
	// wake when the holder's lock expires, not after the backoff (5-10
	// minutes; it was 5-10s against a bound of 4s, which a busy machine
	// could reach).
	l := e.locker(t, &Options{MinRetryBackoff: 10 * time.Minute, MaxRetryBackoff: 10 * time.Minute})
	name := uniqueName(t)
	_, err := l.Acquire(ctx, name, WithTTL(100*time.Millisecond)) // crashed holder: never released
	require.NoError(t, err)

	start := time.Now()
	lease, err := l.Acquire(ctx, name, WithWait(time.Minute))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 30*time.Second, "woke at the holder's expiry, not after the 5-10 minutes' backoff")
	require.NoError(t, lease.Release(ctx))
}

func TestWaitDoesNotBusyLoop(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil) // backoff 8ms doubling to 256ms
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	before := e.hook.calls.Load()
	start := time.Now()
	_, err = l.Acquire(ctx, name, WithWait(time.Second))
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ErrNotObtained)
	var busy *BusyError
	assert.ErrorAs(t, err, &busy, "the wait ran out, ctx did not end")
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	attempts := e.hook.calls.Load() - before
	// 4+8+16+32+64+128+256+256+256 ms already exceed 1s at the jitter's
	// minimum (half): at most about 12 attempts.
	assert.LessOrEqual(t, attempts, int64(14), "attempts in a 1s wait")
	assert.GreaterOrEqual(t, attempts, int64(4), "it did retry")
	assert.GreaterOrEqual(t, elapsed, time.Second, "waited the whole limit")
	assert.Less(t, elapsed, 3*time.Second, "and not much longer")
	require.NoError(t, held.Release(ctx))
}

func TestWaitEndsWithContext(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(cctx, name, WithWait(time.Minute))
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)

	cctx, cancel = context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = l.Acquire(cctx, name, WithWait(time.Minute))
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, held.Release(ctx))
}

func TestUnavailable(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	l := e.locker(t, &Options{ReleaseTimeout: 500 * time.Millisecond})
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)

	e.srv.Kill() // the server is stopped mid-test
	_, err = l.Acquire(ctx, name+"-2")
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.ErrorIs(t, lease.Extend(ctx, time.Minute), ErrUnavailable)
	assert.ErrorIs(t, lease.Release(ctx), ErrUnavailable)
	assert.True(t, lease.Deadline().After(time.Now()), "the lease is unchanged by a failed Release")

	// The server comes back empty: the lock is gone, Release says so.
	e.srv.Restart()
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)

	// A server refusing the command is misconfigured, not unavailable.
	require.NoError(t, e.admin.HSet(ctx, "lock:{wrongtype}:fence", "f", "v").Err())
	_, err = l.Acquire(ctx, "wrongtype")
	require.ErrorIs(t, err, ErrMisconfigured)
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "WRONGTYPE")
}

func TestUnreachableBeforeSend(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	down := errors.New("test: connection refused")
	e.hook.set(func(context.Context, redis.Cmder) error { return down }, nil)
	_, err := l.Acquire(ctx, uniqueName(t))
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, down)
	assert.Equal(t, "fencelock: redis unavailable: test: connection refused", err.Error())
}

func TestInvalidInput(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(ctx) })

	var nilClient *redis.Client
	for _, tc := range []struct {
		name string
		do   func() error
		msg  string
	}{
		{"nil client", func() error { _, err := New(nil, nil); return err }, "nil redis client"},
		{"typed nil client", func() error { _, err := New(nilClient, nil); return err }, "nil redis client"},
		{"prefix with brace", func() error { _, err := New(e.client, &Options{KeyPrefix: "a{b"}); return err }, "KeyPrefix"},
		{"prefix with close brace", func() error { _, err := New(e.client, &Options{KeyPrefix: "a}"}); return err }, "KeyPrefix"},
		{"TTL below the minimum", func() error { _, err := New(e.client, &Options{TTL: 3 * time.Millisecond}); return err }, "shorter than the minimum 10ms"},
		{"negative TTL", func() error { _, err := New(e.client, &Options{TTL: -time.Second}); return err }, "must be positive"},
		{"huge TTL", func() error { _, err := New(e.client, &Options{TTL: math.MaxInt64}); return err }, "longer than the maximum"},
		{"negative retention", func() error { _, err := New(e.client, &Options{FenceRetention: -1}); return err }, "FenceRetention"},
		{"tiny backoff", func() error { _, err := New(e.client, &Options{MinRetryBackoff: time.Microsecond}); return err }, "MinRetryBackoff"},
		{"max below min", func() error {
			_, err := New(e.client, &Options{MinRetryBackoff: time.Second, MaxRetryBackoff: time.Millisecond})
			return err
		}, "MaxRetryBackoff"},
		{"negative release timeout", func() error { _, err := New(e.client, &Options{ReleaseTimeout: -1}); return err }, "ReleaseTimeout"},
		{"empty name", func() error { _, err := l.Acquire(ctx, ""); return err }, "empty lock name"},
		{"name with brace", func() error { _, err := l.Acquire(ctx, "a{b}"); return err }, "contains"},
		{"WithTTL below the minimum", func() error { _, err := l.Acquire(ctx, "x", WithTTL(3*time.Millisecond)); return err }, "minimum"},
		{"WithTTL zero", func() error { _, err := l.Acquire(ctx, "x", WithTTL(0)); return err }, "must be positive"},
		{"WithTTL negative", func() error { _, err := l.Acquire(ctx, "x", WithTTL(-time.Second)); return err }, "must be positive"},
		{"WithTTL MaxInt64", func() error { _, err := l.Acquire(ctx, "x", WithTTL(math.MaxInt64)); return err }, "maximum"},
		{"negative wait", func() error { _, err := l.Acquire(ctx, "x", WithWait(-time.Second)); return err }, "negative"},
		{"nil option", func() error { _, err := l.Acquire(ctx, "x", nil); return err }, "nil Option"},
		{"Extend below the minimum", func() error { return lease.Extend(ctx, time.Millisecond) }, "minimum"},
		{"Extend MaxInt64", func() error { return lease.Extend(ctx, math.MaxInt64) }, "maximum"},
		{"zero Locker", func() error { _, err := (&Locker{}).Acquire(ctx, "x"); return err }, "New"},
		{"nil Locker", func() error { _, err := (*Locker)(nil).Acquire(ctx, "x"); return err }, "New"},
		{"zero Locker RunWithLock", func() error {
			return (&Locker{}).RunWithLock(ctx, "x", func(context.Context, *Lease) error { return nil })
		}, "New"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.hook.calls.Load()
			err := tc.do()
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tc.msg)
			assert.NotErrorIs(t, err, ErrUnavailable)
			assert.Equal(t, before, e.hook.calls.Load(), "no Redis call")
		})
	}
}

func TestDefaults(t *testing.T) {
	got, err := (*Options)(nil).withDefaults()
	require.NoError(t, err)
	require.NotNil(t, got.Logger)
	assert.False(t, got.Logger.Enabled(ctx, slog.LevelError), "the default logger discards")
	got.Logger = nil
	assert.Equal(t, systemClock{}, got.Clock)
	got.Clock = nil
	assert.Equal(t, Options{
		KeyPrefix:       "lock:",
		TTL:             30 * time.Second,
		MinRetryBackoff: 8 * time.Millisecond,
		AttemptTimeout:  time.Second,
		MaxRetryBackoff: 256 * time.Millisecond,
		ReleaseTimeout:  5 * time.Second,
		FenceRetention:  time.Hour,
		Owner:           defaultOwner(),
	}, got)
	got, err = (&Options{MinRetryBackoff: time.Second}).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, time.Second, got.MaxRetryBackoff, "a default max below a given min is raised to it")
}

func TestTTLRounding(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int64
	}{
		{3 * time.Millisecond, 3},
		{3*time.Millisecond + 1, 4},
		{1500 * time.Microsecond, 2},
		{30 * time.Second, 30000},
	} {
		assert.Equal(t, tc.want, ttlMillis(tc.ttl), "ttlMillis(%v)", tc.ttl)
	}
}

func TestLeaseConcurrentUse(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	var wg sync.WaitGroup
	var released atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			for range 20 {
				_ = lease.Deadline()
				if err := lease.Extend(ctx, time.Minute); err != nil && !errors.Is(err, ErrNotHeld) {
					t.Errorf("Extend: %v", err)
				}
			}
			if i%2 == 0 {
				switch err := lease.Release(ctx); {
				case err == nil:
					released.Add(1)
				case !errors.Is(err, ErrNotHeld):
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), released.Load(), "exactly one Release deletes the lock")
	n, err := e.admin.Exists(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// fakeNow is a Clock whose Now is f; its timers are real.
type fakeNow func() time.Time

func (f fakeNow) Now() time.Time                       { return f() }
func (f fakeNow) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

func TestExtendRejectsTTLWithinRenewInterval(t *testing.T) {
	_, l := newMini(t)
	l.opts.RenewInterval = time.Second
	lease, err := l.Acquire(ctx, "job", WithTTL(10*time.Second))
	require.NoError(t, err)
	require.ErrorIs(t, lease.Extend(ctx, time.Second), ErrInvalid, "the watchdog could not renew in time")
	require.NoError(t, lease.Extend(ctx, 2*time.Second))
	require.NoError(t, lease.Release(ctx))
}
