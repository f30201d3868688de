package fencelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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
)

// Property: 16 goroutines in 4 Lockers take permits of one semaphore of 3,
// holding each for a random time: never more than 3 inside at once (an
// atomic counter, incremented after Acquire and decremented before
// Release), every acquisition's fence larger than every fence an
// acquisition got before it began, and, with WithFair, nobody starves: every
// goroutine gets permits, and no wait runs out.
func TestSemaphoreProperty(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "fair"}[fair], func(t *testing.T) {
			srv := redistest.Start(t)
			const lockers, perLocker, permits = 4, 4, 3
			name := uniqueName(t)
			var sems []*Semaphore
			for range lockers {
				c := srv.Client(nil)
				sems = append(sems, lockerFor(t, c, &Options{TTL: 2 * time.Second}).Semaphore(name, permits))
			}
			var (
				inside, most atomic.Int32
				mu           sync.Mutex
				last         int64 // guarded by mu; the greatest fence of the acquisitions returned so far
				wg           sync.WaitGroup
				counts       = make([]int, lockers*perLocker)
				errs         = make([]error, lockers*perLocker)
				stop         = time.Now().Add(2 * time.Second)
			)
			opts := []Option{WithWait(10 * time.Second)}
			if fair {
				opts = append(opts, WithFair())
			}
			for i := range lockers * perLocker {
				sem := sems[i%lockers]
				wg.Go(func() {
					for time.Now().Before(stop) {
						mu.Lock()
						before := last
						mu.Unlock()
						lease, err := sem.Acquire(ctx, opts...)
						if err != nil {
							errs[i] = fmt.Errorf("acquisition %d: %w", counts[i]+1, err)
							return
						}
						n := inside.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						mu.Lock()
						if lease.Fence() <= before {
							errs[i] = fmt.Errorf("fence %d is not above %d, issued before its Acquire began", lease.Fence(), before)
						}
						last = max(last, lease.Fence())
						mu.Unlock()
						counts[i]++
						time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
						inside.Add(-1)
						if err := lease.Release(ctx); err != nil {
							errs[i] = fmt.Errorf("release: %w", err)
							return
						}
						if errs[i] != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			for i, err := range errs {
				assert.NoError(t, err, "goroutine %d", i)
			}
			assert.LessOrEqual(t, most.Load(), int32(permits), "holders inside at once")
			assert.Equal(t, int32(permits), most.Load(), "the permits were all used at once")
			total := 0
			for _, n := range counts {
				total += n
			}
			t.Logf("%d acquisitions, per goroutine %v", total, counts)
			if fair {
				for i, n := range counts {
					assert.Positive(t, n, "goroutine %d starved", i)
				}
			}
			requireAllExpire(t, srv.Client(nil), name)
		})
	}
}

// semChildEnv, when set to "<addr> <name> <permits> <ttl>", makes the test
// binary run semChild instead of the tests (see TestMain).
const semChildEnv = "FENCELOCK_TEST_SEM_CHILD"

// semChild takes a permit of the semaphore with RunWithLock and reports
// "acquired <fence>" once its work has checked its context; it then reads a
// line of stdin (the test pauses the process there) and reports "write <fence>",
// the write it makes without checking again; then "done <lost>" with
// whether RunWithLock reported ErrLost. It returns the exit code.
func semChild(spec string) int {
	f := strings.Fields(spec)
	permits, _ := strconv.Atoi(f[2])
	ttl, _ := time.ParseDuration(f[3])
	client := redis.NewClient(&redis.Options{Addr: f[0]})
	defer client.Close()
	l, err := New(client, nil)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer func() { _ = l.Close() }()
	in := bufio.NewReader(os.Stdin)
	err = l.Semaphore(f[1], permits).RunWithLock(context.Background(), func(ctx context.Context, lease *Lease) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Printf("acquired %d\n", lease.Fence()) // the test pauses the process after this
		if _, err := in.ReadString('\n'); err != nil {
			return err
		}
		fmt.Printf("write %d\n", lease.Fence())
		return nil
	}, WithTTL(ttl))
	fmt.Printf("done %t\n", errors.Is(err, ErrLost))
	return 0
}

// fencedRegister is the protected resource: it accepts a write only with a
// fence greater than every fence it accepted.
type fencedRegister struct {
	mu      sync.Mutex
	highest int64
}

func (r *fencedRegister) write(fence int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence <= r.highest {
		return false
	}
	r.highest = fence
	return true
}

// A holder SIGSTOPped past its permit's TTL loses the permit to a waiter
// (the other permit stays with its holder throughout); the waiter's fenced
// write is accepted, and the paused holder's write, made when it resumes,
// is refused by the fence; its RunWithLock reports ErrLost.
func TestSemaphorePausedHolderLosesItsPermit(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(nil)
	l := lockerFor(t, srv.Client(nil), nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)
	other, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), semChildEnv+"="+srv.Addr+" "+name+" 2 500ms")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	next := func(prefix string) int64 {
		t.Helper()
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the child exited")
			v, found := strings.CutPrefix(line, prefix+" ")
			require.True(t, found, "the child said %q, want %s", line, prefix)
			if prefix == "done" {
				return map[string]int64{"true": 1}[v]
			}
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		case <-time.After(20 * time.Second):
			t.Fatalf("the child did not say %s", prefix)
		}
		return 0
	}
	paused := next("acquired")
	assert.Greater(t, paused, other.Fence())

	waiter := semAcquireInBackground(t, sem, WithWait(20*time.Second), WithTTL(time.Minute))
	child := &child{cmd: cmd}
	child.signal(t, syscall.SIGSTOP)
	var resource fencedRegister
	var got acquired
	select {
	case got = <-waiter:
		require.NoError(t, got.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter got no permit")
	}
	// Fences are the server's TIME in µs at the grant (on a counter this
	// young): the waiter's came once the paused holder's 500ms had passed.
	assert.GreaterOrEqual(t, got.lease.Fence(), paused+(500*time.Millisecond-time.Millisecond).Microseconds(),
		"the permit freed itself at the paused holder's expiry, not before")
	assert.True(t, resource.write(got.lease.Fence()), "the new holder's write")
	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	require.Len(t, info.Holders, 2, "two permits, two holders")
	assert.Equal(t, []string{other.Token(), got.lease.Token()}, []string{info.Holders[0].Token, info.Holders[1].Token})

	_, err = io.WriteString(stdin, "go\n")
	require.NoError(t, err)
	child.signal(t, syscall.SIGCONT)
	stale := next("write")
	assert.Equal(t, paused, stale)
	assert.False(t, resource.write(stale), "the paused holder's stale write is refused by the fence")
	assert.Equal(t, int64(1), next("done"), "its RunWithLock reports ErrLost")

	ttl, err := got.lease.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 50*time.Second, "the paused holder's release did not give back another's permit")
	require.NoError(t, got.lease.Release(ctx))
	require.NoError(t, other.Release(ctx))
	requireAllExpire(t, admin, name)
}

// On Redis Cluster a semaphore's keys share the lock's hash tag, so each
// script runs on one slot; acquisitions, plain and fair waiting (SPUBLISH on
// the key's shard), Inspect and Lease.TTL work on names of every master.
func TestSemaphoreCluster(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	client := c.Client(nil)
	t.Cleanup(func() { _ = client.Close() })
	l := lockerFor(t, client, nil)
	for _, name := range []string{"partner-api", "batch", "a", "b", "c"} {
		sem := l.Semaphore(name, 2)
		lock, err := l.Acquire(ctx, name)
		require.NoError(t, err, "%s: the lock of the name, beside the semaphore", name)
		x, err := sem.Acquire(ctx, WithTTL(time.Minute))
		require.NoError(t, err, name)
		y, err := sem.Acquire(ctx)
		require.NoError(t, err, name)
		assert.Greater(t, y.Fence(), x.Fence())
		_, err = sem.Acquire(ctx)
		require.ErrorIs(t, err, ErrNotObtained, name)
		require.NoError(t, x.Extend(ctx, time.Minute), name)
		ttl, err := x.TTL(ctx)
		require.NoError(t, err, name)
		assert.Positive(t, ttl)

		plain := semAcquireInBackground(t, sem, WithWait(20*time.Second))
		fair := semAcquireInBackground(t, sem, WithWait(20*time.Second), WithFair())
		require.Eventually(t, func() bool {
			info, err := sem.Inspect(ctx)
			require.NoError(t, err)
			n, err := client.ZCard(ctx, semKey(name, ":q")).Result()
			require.NoError(t, err)
			return info.Waiters >= 1 && n == 1
		}, 10*time.Second, time.Millisecond, "%s: both waiting", name)
		require.NoError(t, x.Release(ctx))
		require.NoError(t, y.Release(ctx))
		for _, w := range []<-chan acquired{plain, fair} {
			select {
			case r := <-w:
				require.NoError(t, r.err, name)
				assert.Greater(t, r.lease.Fence(), y.Fence())
				require.NoError(t, r.lease.Release(ctx))
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: a waiter got no permit", name)
			}
		}
		info, err := sem.Inspect(ctx)
		require.NoError(t, err)
		assert.Empty(t, info.Holders)
		assert.Positive(t, info.LastFence)
		require.NoError(t, lock.Release(ctx))
		requireAllExpire(t, client, name)
	}
}

// Every key a semaphore writes expires, whatever ended its last call:
// permits held, a plain waiter's flag, a fair line, retired tokens, a wait
// that gave up, a holder that crashed.
func TestSemaphoreKeysExpire(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 1)
	held, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	_, err = sem.Acquire(ctx) // sets the waiter flag
	require.ErrorIs(t, err, ErrNotObtained)
	wctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := sem.Acquire(wctx, WithWait(time.Minute), WithFair()) // joins the line
		gaveUp <- err
	}()
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, semKey(name, ":q"), semKey(name, ":qi")).Result()
		return err == nil && n == 2
	}, 10*time.Second, time.Millisecond, "the fair waiter in line")
	requireAllExpire(t, e.admin, name)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, semKey(name, ":q")).Result()
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond, "the waiter that gave up left the line")
	requireAllExpire(t, e.admin, name)
	require.NoError(t, held.Release(ctx))
	keys := requireAllExpire(t, e.admin, name)
	assert.Contains(t, keys, semKey(name, ":t:")+held.Token(), "the released token's marker")
	assert.Contains(t, keys, semKey(name, ":fence"))
	assert.NotContains(t, keys, semKey(name, ""), "no holder left")

	// A holder that never gives its permit back: the keys expire with it.
	_, err = sem.Acquire(ctx, WithTTL(100*time.Millisecond))
	require.NoError(t, err)
	requireAllExpire(t, e.admin, name)
	time.Sleep(200 * time.Millisecond)
	n, err := e.admin.Exists(ctx, semKey(name, ""), semKey(name, ":h")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the holders and their info expired with the last permit")
}
