package fencelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
)

func TestRWLockInvalid(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	work := func(context.Context, *Lease) error { return nil }
	check := func(rw *RWLock, what string, opts ...Option) {
		t.Helper()
		_, err := rw.Acquire(ctx, opts...)
		require.ErrorIs(t, err, ErrInvalid, what)
		_, err = rw.AcquireShared(ctx, opts...)
		require.ErrorIs(t, err, ErrInvalid, what)
		require.ErrorIs(t, rw.RunWithLock(ctx, work, opts...), ErrInvalid, what)
		require.ErrorIs(t, rw.RunWithSharedLock(ctx, work, opts...), ErrInvalid, what)
	}
	check(l.RWLock(""), "empty name")
	check(l.RWLock("a{b}"), "name with braces")
	check(l.RWLock("a"), "WithFair", WithWait(time.Second), WithFair())
	check(l.RWLock("a"), "nil option", nil)
	require.ErrorIs(t, l.RWLock("a").RunWithLock(ctx, nil), ErrInvalid)
	_, err := l.RWLock("").Inspect(ctx)
	require.ErrorIs(t, err, ErrInvalid)
	var nilLocker *Locker
	check(nilLocker.RWLock("a"), "nil Locker")
	assert.Zero(t, e.hook.calls.Load(), "no Redis call")

	r := newRedlockEnv(t, 3, nil)
	rl := r.locker(t, nil)
	check(rl.RWLock("a"), "Redlock")
	_, err = rl.RWLock("a").Inspect(ctx)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "NewRedlock")
	for _, h := range r.hooks {
		assert.Zero(t, h.calls.Load(), "no Redis call")
	}
}

// Readers share, a writer excludes them and other writers; every lease is
// an ordinary one; fences increase across all of them; a plain lock of the
// same name is another lock.
func TestRWLockSharedOrExclusive(t *testing.T) {
	e := newEnv(t, nil)
	a := e.locker(t, &Options{Owner: "a"})
	b := e.locker(t, &Options{Owner: "b"})
	name := uniqueName(t)
	rwA, rwB := a.RWLock(name), b.RWLock(name)
	var last int64
	next := func(lease *Lease) {
		t.Helper()
		assert.Greater(t, lease.Fence(), last, "fences increase across the RWLock's leases")
		last = lease.Fence()
	}

	r1, err := rwA.AcquireShared(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	next(r1)
	r2, err := rwB.AcquireShared(ctx, WithTTL(30*time.Second))
	require.NoError(t, err)
	next(r2)
	assert.NotEqual(t, r1.Key(), r2.Key(), "a reader's own key")
	assert.True(t, strings.HasPrefix(r1.Key(), "lock:{"+name+"}:rw:r:"), r1.Key())
	ttl, err := r2.TTL(ctx)
	require.NoError(t, err)
	assert.Positive(t, ttl)

	_, err = rwB.Acquire(ctx)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, name, busy.Name)
	assert.Equal(t, "a and 1 more readers", busy.Owner, "the longest-lived reader, and how many more")
	assert.Greater(t, busy.TTL, 30*time.Second)

	info, err := rwA.Inspect(ctx)
	require.NoError(t, err)
	assert.Equal(t, name, info.Name)
	assert.Nil(t, info.Writer)
	require.Len(t, info.Readers, 2)
	assert.Equal(t, RWHolder{Owner: "b", TTL: info.Readers[0].TTL, Fence: r2.Fence()}, info.Readers[0], "by expiry")
	assert.Equal(t, "a", info.Readers[1].Owner)
	assert.Equal(t, r1.Fence(), info.Readers[1].Fence)
	assert.Greater(t, info.Readers[1].TTL, 30*time.Second)
	assert.Equal(t, last, info.LastFence)
	assert.Zero(t, info.WritersWaiting, "a writer that tried once leaves no intent")

	// A plain lock of the same name is apart.
	plain, err := a.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, plain.Release(ctx))

	require.NoError(t, r1.Extend(ctx, 10*time.Second))
	require.NoError(t, r1.Release(ctx))
	_, err = rwB.Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained, "one reader left")
	require.NoError(t, r2.Release(ctx))

	w, err := rwB.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	next(w)
	assert.Equal(t, "lock:{"+name+"}:rw:w", w.Key())
	ttl, err = w.TTL(ctx)
	require.NoError(t, err)
	assert.Positive(t, ttl)
	for _, try := range []func() (*Lease, error){
		func() (*Lease, error) { return rwA.Acquire(ctx) },
		func() (*Lease, error) { return rwA.AcquireShared(ctx) },
	} {
		_, err = try()
		require.ErrorAs(t, err, &busy)
		assert.Equal(t, "b", busy.Owner)
	}
	info, err = rwA.Inspect(ctx)
	require.NoError(t, err)
	require.NotNil(t, info.Writer)
	assert.Equal(t, "b", info.Writer.Owner)
	assert.Equal(t, w.Fence(), info.Writer.Fence)
	assert.Empty(t, info.Readers)
	require.NoError(t, w.Extend(ctx, time.Minute))
	require.NoError(t, w.Release(ctx))
	require.ErrorIs(t, w.Release(ctx), ErrNotHeld)

	plain, err = a.Acquire(ctx, name)
	require.NoError(t, err)
	next(plain) // its own counter, floored by the server's clock
	require.NoError(t, plain.Release(ctx))
	r3, err := rwA.AcquireShared(ctx)
	require.NoError(t, err)
	next(r3)
	require.NoError(t, r3.Release(ctx))

	// One counter for readers and writers: one far ahead of the clock
	// (several fences within a microsecond, or a clock stepped back) is
	// counted on by both.
	ahead := time.Now().Add(24 * time.Hour).UnixMicro()
	require.NoError(t, e.admin.Set(ctx, "lock:{"+name+"}:rw:fence", ahead, time.Minute).Err())
	r4, err := rwA.AcquireShared(ctx)
	require.NoError(t, err)
	assert.Equal(t, ahead+1, r4.Fence())
	require.NoError(t, r4.Release(ctx))
	w, err = rwA.Acquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, ahead+2, w.Fence())
	require.NoError(t, w.Release(ctx))
	requireEveryKeyExpires(t, e.admin)
	keys, err := e.admin.Keys(ctx, "lock:{"+name+"}:rw*").Result()
	require.NoError(t, err)
	assert.NotEmpty(t, keys)
}

// A waiting writer waits for the readers already in, and no longer: new
// readers, trying once or waiting, stay out until it has had the lock, and
// then enter together. The Locker's backoff is 20s: only wake-ups explain
// each step.
func TestRWLockWaitingWriterStopsNewReaders(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	rw := l.RWLock(uniqueName(t))
	in, err := rw.AcquireShared(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	type got struct {
		lease *Lease
		err   error
	}
	writer := make(chan got, 1)
	go func() {
		lease, err := rw.Acquire(ctx, WithWait(time.Minute), WithTTL(time.Minute))
		writer <- got{lease, err}
	}()
	require.Eventually(t, func() bool {
		info, err := rw.Inspect(ctx)
		return err == nil && info.WritersWaiting == 1
	}, 5*time.Second, time.Millisecond, "the writer's intent")
	_, err = rw.AcquireShared(ctx)
	var busy *BusyError
	require.ErrorAs(t, err, &busy, "a reader trying once stays out")
	assert.Equal(t, time.Duration(-3), busy.TTL)
	assert.Equal(t, "writers waiting", busy.Owner)
	readers := make(chan got, 2)
	for range 2 {
		go func() {
			lease, err := rw.AcquireShared(ctx, WithWait(time.Minute))
			readers <- got{lease, err}
		}()
	}
	time.Sleep(50 * time.Millisecond) // the readers wait (they cannot be seen from outside)

	require.NoError(t, in.Release(ctx))
	var w got
	select {
	case w = <-writer:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer was not let in when the last reader left")
	}
	require.NoError(t, w.err)
	assert.Greater(t, w.lease.Fence(), in.Fence())
	info, err := rw.Inspect(ctx)
	require.NoError(t, err)
	assert.Empty(t, info.Readers)
	assert.Zero(t, info.WritersWaiting)
	select {
	case r := <-readers:
		t.Fatalf("a reader entered while the writer holds the lock: %v", r.err)
	default:
	}

	require.NoError(t, w.lease.Release(ctx))
	var shared []*Lease
	for range 2 {
		select {
		case r := <-readers:
			require.NoError(t, r.err)
			assert.Greater(t, r.lease.Fence(), w.lease.Fence())
			shared = append(shared, r.lease)
		case <-time.After(10 * time.Second):
			t.Fatal("the readers were not let in when the writer left")
		}
	}
	info, err = rw.Inspect(ctx)
	require.NoError(t, err)
	assert.Len(t, info.Readers, 2, "they hold it together")

	// A writer whose wait ends lets the readers in at once.
	quit, cancel := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() {
		_, err := rw.Acquire(quit, WithWait(time.Minute))
		writerDone <- err
	}()
	require.Eventually(t, func() bool {
		info, err := rw.Inspect(ctx)
		return err == nil && info.WritersWaiting == 1
	}, 5*time.Second, time.Millisecond)
	reader := make(chan got, 1)
	go func() {
		lease, err := rw.AcquireShared(ctx, WithWait(time.Minute))
		reader <- got{lease, err}
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-writerDone, context.Canceled)
	select {
	case r := <-reader:
		require.NoError(t, r.err)
		shared = append(shared, r.lease)
	case <-time.After(10 * time.Second):
		t.Fatal("the reader was not let in when the writer gave up")
	}
	for _, lease := range shared {
		require.NoError(t, lease.Release(ctx))
	}
	requireEveryKeyExpires(t, e.admin)
}

// A writer that stops keeping its intent alive (it crashed, or Redis no
// longer hears it) holds the readers back for the intent's TTL at most.
func TestRWLockCrashedWriterIntentExpires(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	other, err := New(e.srv.Client(nil), nil) // not through the hook
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	rw := l.RWLock(uniqueName(t))
	in, err := other.RWLock(rw.Name()).AcquireShared(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	writer := make(chan error, 1)
	go func() {
		_, err := rw.Acquire(ctx, WithWait(time.Minute))
		writer <- err
	}()
	require.Eventually(t, func() bool {
		info, err := rw.Inspect(ctx)
		return err == nil && info.WritersWaiting == 1
	}, 5*time.Second, time.Millisecond)
	// The writer's Locker loses Redis: it is still waiting, but its intent
	// is no longer kept alive.
	down := errors.New("test: unreachable")
	e.hook.set(func(context.Context, redis.Cmder) error { return down }, nil)
	_, err = other.RWLock(rw.Name()).AcquireShared(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	lease, err := other.RWLock(rw.Name()).AcquireShared(ctx, WithWait(10*time.Second))
	require.NoError(t, err, "the reader enters once the intent expired")
	select {
	case err := <-writer:
		t.Fatalf("the writer's wait ended: %v", err)
	default:
	}
	e.hook.set(nil, nil)
	require.NoError(t, lease.Release(ctx))
	require.NoError(t, in.Release(ctx))
	require.NoError(t, <-writer)
}

// The property: from 6 goroutines in 2 Lockers, readers and writers never
// hold the lock at once, two writers never do, and fences increase, a
// writer's above every lease before it.
func TestRWLockReadersAndWritersNeverOverlap(t *testing.T) {
	e := newEnv(t, nil)
	lockers := []*Locker{e.locker(t, nil), e.locker(t, nil)}
	name := uniqueName(t)
	var (
		readers, writers atomic.Int32
		mu               sync.Mutex
		maxFence         int64 // guarded by mu; of every lease so far
		writerFence      int64 // guarded by mu; of the last writer
		failed           = make(chan error, 32)
		wg               sync.WaitGroup
		reads, writes    atomic.Int64
	)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	for g := range 6 {
		rw := lockers[g%2].RWLock(name)
		rng := rand.New(rand.NewPCG(uint64(g), 11))
		wg.Go(func() {
			for range 20 {
				hold := time.Duration(rng.IntN(3)) * time.Millisecond
				var err error
				if rng.IntN(3) == 0 {
					err = rw.RunWithLock(ctx, func(ctx context.Context, lease *Lease) error {
						if n := writers.Add(1); n != 1 || readers.Load() != 0 {
							fail(fmt.Errorf("a writer with %d writers and %d readers", n, readers.Load()))
						}
						mu.Lock()
						if lease.Fence() <= maxFence {
							fail(fmt.Errorf("writer's fence %d after %d", lease.Fence(), maxFence))
						}
						maxFence, writerFence = lease.Fence(), lease.Fence()
						mu.Unlock()
						time.Sleep(hold)
						writers.Add(-1)
						writes.Add(1)
						return ctx.Err()
					}, WithWait(20*time.Second), WithTTL(2*time.Second))
				} else {
					err = rw.RunWithSharedLock(ctx, func(ctx context.Context, lease *Lease) error {
						readers.Add(1)
						if n := writers.Load(); n != 0 {
							fail(fmt.Errorf("a reader with %d writers", n))
						}
						mu.Lock()
						if lease.Fence() <= writerFence {
							fail(fmt.Errorf("reader's fence %d after the writer's %d", lease.Fence(), writerFence))
						}
						maxFence = max(maxFence, lease.Fence())
						mu.Unlock()
						time.Sleep(hold)
						readers.Add(-1)
						reads.Add(1)
						return ctx.Err()
					}, WithWait(20*time.Second), WithTTL(2*time.Second))
				}
				if err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Error(err)
	}
	assert.Equal(t, int64(6*20), reads.Load()+writes.Load())
	t.Logf("%d reads, %d writes", reads.Load(), writes.Load())
	requireEveryKeyExpires(t, e.admin)
}

// An attempt whose reply was lost may have taken a share: the clean-up
// gives it back.
func TestRWLockUnknownOutcomeIsGivenBack(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	rw := l.RWLock(uniqueName(t))
	var dropped atomic.Bool
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (args[1] == script.RWRead.Hash || args[1] == script.RWRead.Src) && !dropped.Swap(true) {
			return errReplyLost
		}
		return nil
	})
	_, err := rw.AcquireShared(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	require.True(t, dropped.Load())
	require.Eventually(t, func() bool {
		info, err := rw.Inspect(ctx)
		return err == nil && len(info.Readers) == 0
	}, 5*time.Second, time.Millisecond, "the share given back")
	w, err := rw.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Release(ctx))
	requireEveryKeyExpires(t, e.admin)
}

func TestRWLockCluster(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	client := c.Client(nil)
	l, err := New(client, slowPolling)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	for _, name := range []string{"catalogue", "order:1", "order:2"} {
		rw := l.RWLock(name)
		r1, err := rw.AcquireShared(ctx, WithTTL(time.Minute))
		require.NoError(t, err)
		r2, err := rw.AcquireShared(ctx)
		require.NoError(t, err)
		writer := make(chan error, 1)
		go func() {
			lease, err := rw.Acquire(ctx, WithWait(time.Minute))
			if err == nil {
				assert.Greater(t, lease.Fence(), r2.Fence())
				err = lease.Release(ctx)
			}
			writer <- err
		}()
		require.Eventually(t, func() bool {
			info, err := rw.Inspect(ctx)
			return err == nil && info.WritersWaiting == 1
		}, 5*time.Second, time.Millisecond)
		require.NoError(t, r1.Extend(ctx, time.Minute))
		require.NoError(t, r1.Release(ctx))
		require.NoError(t, r2.Release(ctx))
		select {
		case err := <-writer:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("no wake-up on the Cluster")
		}
	}
	requireEveryKeyExpires(t, client)
}

// rwChildEnv, when set to "<addr> <name> <ttl>", makes the test binary run
// rwChild instead of the tests (see TestMain).
const rwChildEnv = "FENCELOCK_TEST_RW_CHILD"

// fencedWrite is the resource: it accepts a write only with a fence
// greater than every one it accepted.
var fencedWrite = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then
	return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)
return 1`)

// rwChild is a reader in a process of its own, for the test that pauses
// it: it takes a share, kept alive, reports "shared <fence>", and, on a
// line on its standard input, writes to the resource with its fence and
// reports "accepted" or "refused".
func rwChild(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 3 {
		fmt.Println("bad spec", spec)
		return 2
	}
	ttl, err := time.ParseDuration(f[2])
	if err != nil {
		fmt.Println(err)
		return 2
	}
	client := redis.NewClient(&redis.Options{Addr: f[0]})
	defer func() { _ = client.Close() }()
	l, err := New(client, nil)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	defer func() { _ = l.Close() }()
	lease, err := l.RWLock(f[1]).AcquireShared(ctx, WithTTL(ttl))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	_ = lease.KeepAlive(ctx)
	fmt.Println("shared", lease.Fence())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ok, err := fencedWrite.Run(ctx, client, []string{"resource:" + f[1]}, lease.Fence()).Int()
	switch {
	case err != nil:
		fmt.Println("error:", err)
		return 1
	case ok == 1:
		fmt.Println("accepted")
	default:
		fmt.Println("refused")
	}
	_ = lease.Release(ctx)
	return 0
}

// A reader paused (SIGSTOP) past its TTL: the writer gets in, and the
// stale reader's fenced write, when it resumes, is refused.
func TestRWLockPausedReaderIsFencedOut(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	rw := l.RWLock(name)
	const ttl = 300 * time.Millisecond

	exe, err := os.Executable()
	require.NoError(t, err)
	c := &child{cmd: exec.Command(exe), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), rwChildEnv+"="+e.srv.Addr+" "+name+" "+ttl.String())
	stdin, err := c.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	lines := make(chan string, 4)
	go func() {
		defer close(c.done)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		_ = c.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	line := func() string {
		t.Helper()
		select {
		case s := <-lines:
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("the child said nothing")
			return ""
		}
	}

	f := strings.Fields(line())
	require.Len(t, f, 2)
	require.Equal(t, "shared", f[0], f)
	readerFence, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	_, err = rw.Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained, "the reader's watchdog keeps its share")

	c.signal(t, syscall.SIGSTOP)
	w, err := rw.Acquire(ctx, WithWait(10*time.Second))
	require.NoError(t, err, "the writer gets in once the paused reader's share expired")
	assert.Greater(t, w.Fence(), readerFence)
	ok, err := fencedWrite.Run(ctx, e.admin, []string{"resource:" + name}, w.Fence()).Int()
	require.NoError(t, err)
	require.Equal(t, 1, ok, "the writer's write")

	require.NoError(t, c.cmd.Process.Signal(syscall.SIGCONT))
	_, err = stdin.Write([]byte("write\n"))
	require.NoError(t, err)
	assert.Equal(t, "refused", line(), "the stale reader's write")
	require.NoError(t, w.Release(ctx))
}
