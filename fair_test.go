package fencelock

import (
	"bytes"
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

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/store"
)

// Tests of fair waiting (WithFair, issue 16): the order waiters are served
// in, the hand-off by the release, the Deadline of a lease granted while its
// waiter was slow or paused, lost grant messages, and waiters that give up
// or crash. Each starts its own redis-server processes; the paused and the
// crashed waiters are child processes (fairChild), stopped with SIGSTOP and
// killed with SIGKILL.

// fairChildEnv, when set to "<addr> <name> <ttl> [<deadline>]", makes the
// test binary run fairChild instead of the tests (see TestMain).
const fairChildEnv = "FENCELOCK_TEST_FAIR_CHILD"

// queued returns the tokens in name's fair queue, first first.
func queued(t *testing.T, admin *redis.Client, name string) []string {
	t.Helper()
	tokens, err := admin.ZRange(ctx, "lock:{"+name+"}:q", 0, -1).Result()
	require.NoError(t, err)
	return tokens
}

// waitQueued waits until name's queue has n waiters and returns their tokens.
func waitQueued(t *testing.T, admin *redis.Client, name string, n int) []string {
	t.Helper()
	var tokens []string
	require.Eventually(t, func() bool {
		tokens = queued(t, admin, name)
		return len(tokens) == n
	}, 10*time.Second, time.Millisecond, "waiting for %d waiters in line", n)
	return tokens
}

// holderOf returns the token that holds name's lock, or "".
func holderOf(t *testing.T, admin *redis.Client, name string) (token string, fence int64) {
	t.Helper()
	v, err := admin.Get(ctx, "lock:{"+name+"}").Result()
	if errors.Is(err, redis.Nil) {
		return "", 0
	}
	require.NoError(t, err)
	token, fence, _ = keys.Parse(v)
	return token, fence
}

// waitSubscribed waits until a waiter subscribes to name's wake-ups.
func waitSubscribed(t *testing.T, srv *redistest.Server, name string) {
	t.Helper()
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, "lock:{"+name+"}") == 1 },
		10*time.Second, time.Millisecond, "the waiter's subscription")
}

// waitInLine starts a fair Acquire of name on l in the background and
// returns once it is in the lock's line and its channel is subscribed.
func waitInLine(t *testing.T, e *env, l *Locker, name string, opts ...Option) <-chan acquired {
	t.Helper()
	got := acquireInBackground(t, l, name, append([]Option{WithFair()}, opts...)...)
	waitQueued(t, e.admin, name, 1)
	waitSubscribed(t, e.srv, name)
	return got
}

func lockerFor(t *testing.T, c redis.UniversalClient, opts *Options) *Locker {
	t.Helper()
	l, err := New(c, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// fairEnv is a redis-server and two Lockers on it: near, connected
// directly, and far, through a proxy that can slow or cut its link. Each
// client has a faultHook.
type fairEnv struct {
	srv               *redistest.Server
	admin             *redis.Client
	proxy             *redistest.Proxy
	near, far         *Locker
	nearHook, farHook *faultHook
}

func newFairEnv(t *testing.T, nearOpts, farOpts *Options) *fairEnv {
	t.Helper()
	e := &fairEnv{srv: redistest.Start(t), nearHook: &faultHook{}, farHook: &faultHook{}}
	e.admin = e.srv.Client(nil)
	e.proxy = redistest.StartProxy(t, e.srv.Addr)
	nc := e.srv.Client(nil)
	nc.AddHook(e.nearHook)
	fc := redis.NewClient(&redis.Options{Addr: e.proxy.Addr})
	fc.AddHook(e.farHook)
	t.Cleanup(func() { _ = fc.Close() })
	e.near, e.far = lockerFor(t, nc, nearOpts), lockerFor(t, fc, farOpts)
	return e
}

// countAttempts returns a hook function that counts the acquire scripts
// sent.
func countAttempts(n *atomic.Int32) func(context.Context, redis.Cmder) error {
	return func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" {
			n.Add(1)
		}
		return nil
	}
}

// Property: waiters that joined the line 1ms apart are served in that order,
// each with a greater fence, whatever the number of waiters and the time
// each holds the lock; the queue is gone afterwards.
func TestFairServesWaitersInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	lockers := []*Locker{e.locker(t, nil), lockerFor(t, e.srv.Client(nil), nil)}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 16))
	for round := range 6 {
		name := fmt.Sprintf("%s.%d", uniqueName(t), round)
		holder, err := lockers[0].Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)

		type served struct {
			i     int
			fence int64
			err   error
		}
		n := 2 + rng.IntN(9)
		order := make(chan served, n)
		var wg sync.WaitGroup
		for i := range n {
			l, hold := lockers[rng.IntN(len(lockers))], time.Duration(rng.IntN(2000))*time.Microsecond
			wg.Go(func() {
				lease, err := l.Acquire(ctx, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
				if err != nil {
					order <- served{i: i, err: err}
					return
				}
				order <- served{i: i, fence: lease.Fence()}
				time.Sleep(hold)
				assert.NoError(t, lease.Release(ctx))
			})
			waitQueued(t, e.admin, name, i+1)
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, holder.Release(ctx))
		last := holder.Fence()
		for want := range n {
			select {
			case s := <-order:
				require.NoError(t, s.err)
				assert.Equal(t, want, s.i, "round %d: waiter %d was served in place %d", round, s.i, want)
				assert.Greater(t, s.fence, last, "fences increase in the order served")
				last = s.fence
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: %d of %d waiters served", round, want, n)
			}
		}
		wg.Wait()
		n2, err := e.admin.Exists(ctx, "lock:{"+name+"}", "lock:{"+name+"}:q", "lock:{"+name+"}:qi").Result()
		require.NoError(t, err)
		assert.Zero(t, n2, "no lock and no queue left")
	}
}

// The release hands the lock to the first waiter, which holds it when the
// message arrives: it sends no attempt after the release. Its link is slow
// (100ms each way), so the message arrives well after the grant started the
// lock's TTL: the lease's Deadline still comes before the server's expiry.
func TestFairHandOffToSlowWaiter(t *testing.T) {
	t.Parallel()
	e := newFairEnv(t, nil, nil)
	srv, admin, proxy, holders, waiters := e.srv, e.admin, e.proxy, e.near, e.far
	name := uniqueName(t)

	holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	proxy.SetLatency(100 * time.Millisecond)
	got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Minute), WithTTL(2*time.Second))
	tokens := waitQueued(t, admin, name, 1)
	waitSubscribed(t, srv, name)

	// attempts counts the waiter's attempts sent after the release: one
	// before it (its entry gone once, when a busy machine ran its
	// keep-alives more than queueEntryTTL apart: it joins the line again)
	// is not what the test is about.
	var attempts atomic.Int32
	var released atomic.Bool
	count := countAttempts(&attempts)
	kept := make(chan struct{}, 1)
	e.farHook.set(func(c context.Context, cmd redis.Cmder) error {
		if released.Load() {
			return count(c, cmd)
		}
		return nil
	}, keptAlive(kept))
	// Release just after a keep-alive's reply, with the subscription
	// confirmed on the waiter's side: the grant's message, not the next
	// keep-alive, brings the lock.
	require.Eventually(t, func() bool { return waitsOf(waiters).Subscribed("lock:{" + name + "}") },
		10*time.Second, time.Millisecond, "the waiter's subscription confirmed")
	time.Sleep(300 * time.Millisecond) // the keep-alive the confirmation prompts
	waitKeptAlive(t, kept)
	released.Store(true)
	require.NoError(t, holder.Release(ctx))
	token, fence := holderOf(t, admin, name)
	require.Equal(t, tokens[0], token, "the release handed the lock to the waiter")
	assert.Greater(t, fence, holder.Fence())

	r := requireAcquired(t, got, 10*time.Second, "the slow waiter")
	sent := time.Now()
	pttl, err := admin.PTTL(ctx, r.lease.Key()).Result()
	require.NoError(t, err)
	expiry := sent.Add(pttl) // no later than the server's expiry
	t.Logf("margin %v", expiry.Sub(r.lease.Deadline()))
	assert.False(t, r.lease.Deadline().After(expiry),
		"Deadline %v after the server's expiry (%v later)", r.lease.Deadline(), r.lease.Deadline().Sub(expiry))
	assert.Equal(t, tokens[0], r.lease.Token())
	assert.Equal(t, fence, r.lease.Fence(), "the fence the release issued")
	assert.Zero(t, attempts.Load(), "no attempt after the release: the message carried the lock")
	require.NoError(t, r.lease.Release(ctx))
}

// keptAlive returns a hook function that signals kept when the reply to a
// fair waiter's keep-alive came.
func keptAlive(kept chan struct{}) func(context.Context, redis.Cmder) error {
	return func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "queue" {
			select {
			case kept <- struct{}{}:
			default:
			}
		}
		return nil
	}
}

// waitKeptAlive waits for the reply to a keep-alive that comes from now on.
func waitKeptAlive(t *testing.T, kept chan struct{}) {
	t.Helper()
	select {
	case <-kept:
	default:
	}
	select {
	case <-kept:
	case <-time.After(5 * time.Second):
		t.Fatal("no keep-alive")
	}
}

// fairChild is a fair waiter in a process of its own, for the tests that
// pause or kill it: it waits for the lock, then reports on stdout
// "acquired <token> <fence> <margin µs> <held>", the margin being how long
// before the server's expiry its lease's Deadline falls (negative: after),
// and held whether the lock was its own when it looked. With a deadline,
// Acquire's context ends that long after the start, and an Acquire that
// fails reports "late <µs>": how long after the context's deadline it
// returned.
func fairChild(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 3 && len(f) != 4 {
		fmt.Println("bad spec", spec)
		return 2
	}
	ttl, err := time.ParseDuration(f[2])
	if err != nil {
		fmt.Println(err)
		return 2
	}
	timeout := 30 * time.Second
	if len(f) == 4 {
		if timeout, err = time.ParseDuration(f[3]); err != nil {
			fmt.Println(err)
			return 2
		}
	}
	client := redis.NewClient(&redis.Options{Addr: f[0]})
	defer func() { _ = client.Close() }()
	l, err := New(client, nil)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	defer func() { _ = l.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lease, err := l.Acquire(ctx, f[1], WithFair(), WithWait(20*time.Second), WithTTL(ttl))
	if err != nil && len(f) == 4 {
		deadline, _ := ctx.Deadline()
		fmt.Printf("late %d %v\n", time.Since(deadline).Microseconds(), err)
		return 0
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	sent := time.Now()
	pttl, err := client.PTTL(ctx, lease.Key()).Result()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	value, err := client.Get(ctx, lease.Key()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		fmt.Println("error:", err)
		return 1
	}
	held := strings.HasPrefix(value, lease.Token()+" ")
	fmt.Printf("acquired %s %d %d %t\n", lease.Token(), lease.Fence(), sent.Add(pttl).Sub(lease.Deadline()).Microseconds(), held)
	_ = lease.Release(ctx)
	return 0
}

// child is a fairChild process.
type child struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // read after done
	done chan struct{}
}

// startFairChild starts fairChild as a waiter for name on srv; the test's
// clean-up kills it.
func startFairChild(t *testing.T, srv *redistest.Server, name string, ttl time.Duration, deadline ...time.Duration) *child {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := &child{cmd: exec.Command(exe), done: make(chan struct{})}
	spec := srv.Addr + " " + name + " " + ttl.String()
	for _, d := range deadline {
		spec += " " + d.String()
	}
	c.cmd.Env = append(os.Environ(), fairChildEnv+"="+spec)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	require.NoError(t, c.cmd.Start())
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

// signal sends sig to the child; for SIGSTOP, it returns once every thread
// of the child has stopped (the signal takes effect asynchronously).
func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig))
	if sig != syscall.SIGSTOP {
		return
	}
	tasks := fmt.Sprintf("/proc/%d/task", c.cmd.Process.Pid)
	require.Eventually(t, func() bool {
		ids, err := os.ReadDir(tasks)
		require.NoError(t, err)
		for _, id := range ids {
			b, err := os.ReadFile(tasks + "/" + id.Name() + "/stat")
			if err != nil {
				return false
			}
			// "pid (comm) S ...": the state follows the last ')'.
			st := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
			if len(st) == 0 || (st[0] != "T" && st[0] != "t") {
				return false
			}
		}
		return true
	}, 5*time.Second, 100*time.Microsecond, "the child stops")
}

// report waits for the child to exit and returns its report's fields:
// token, fence, margin, held.
func (c *child) report(t *testing.T) []string {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not exit")
	}
	require.True(t, c.cmd.ProcessState.Success(), "child: %s", &c.out)
	f := strings.Fields(strings.TrimSpace(c.out.String()))
	require.Len(t, f, 5, "child: %s", &c.out)
	require.Equal(t, "acquired", f[0], "child: %s", &c.out)
	return f[1:]
}

// A waiter SIGSTOPped when the release grants it the lock learns of the
// grant only when it resumes; its lease's Deadline still comes before the
// server's expiry. After a short pause it holds the granted lock; after a
// pause longer than the TTL the granted lock has expired, and it takes the
// lock again, or waits in line for it if another took it meanwhile, instead
// of returning a lease whose lock it does not hold.
func TestFairDeadlineBoundPausedWaiter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		pause   time.Duration
		expired bool
		taken   bool // another takes the lock during the pause, for 1s
	}{
		{"resumed while the lock lives", 400 * time.Millisecond, false, false},
		{"resumed after the lock expired", 1500 * time.Millisecond, true, false},
		{"resumed after the lock expired and was taken", 1500 * time.Millisecond, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			admin := srv.Client(nil)
			holders := lockerFor(t, admin, nil)
			name := uniqueName(t)
			holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
			require.NoError(t, err)

			c := startFairChild(t, srv, name, time.Second)
			tokens := waitQueued(t, admin, name, 1)
			waitSubscribed(t, srv, name)
			// Stop it just after a keep-alive: it resumes before its next
			// one is due, and learns of the grant from the message.
			entry := func() string {
				v, err := admin.HGet(ctx, "lock:{"+name+"}:qi", tokens[0]).Result()
				require.NoError(t, err)
				return v
			}
			before := entry()
			require.Eventually(t, func() bool { return entry() != before }, 5*time.Second, 100*time.Microsecond)
			c.signal(t, syscall.SIGSTOP)
			require.NoError(t, holder.Release(ctx))
			token, fence := holderOf(t, admin, name)
			require.Equal(t, tokens[0], token, "granted to the paused waiter")
			time.Sleep(tc.pause)
			if tc.expired {
				n, err := admin.Exists(ctx, "lock:{"+name+"}").Result()
				require.NoError(t, err)
				require.Zero(t, n, "the granted lock expired during the pause")
			}
			var other *Lease
			if tc.taken {
				other, err = holders.Acquire(ctx, name, WithTTL(time.Minute))
				require.NoError(t, err)
				fence = other.Fence()
				time.AfterFunc(time.Second, func() { _ = other.Release(ctx) })
			}
			c.signal(t, syscall.SIGCONT)

			report := c.report(t)
			margin, err := strconv.ParseInt(report[2], 10, 64)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, margin, int64(0), "the Deadline comes %dµs after the server's expiry", -margin)
			assert.Equal(t, "true", report[3], "the lock was the child's when Acquire returned")
			got, err := strconv.ParseInt(report[1], 10, 64)
			require.NoError(t, err)
			if tc.expired {
				assert.Greater(t, got, fence, "a new fence")
			} else {
				assert.Equal(t, tokens[0], report[0])
				assert.Equal(t, fence, got, "the fence the release issued")
			}
		})
	}
}

// A waiter that crashed is skipped once its queue entry expired: the
// release hands the lock to the next live waiter.
func TestFairSkipsCrashedWaiter(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(nil)
	l := lockerFor(t, admin, nil)
	name := uniqueName(t)
	holder, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	c := startFairChild(t, srv, name, time.Minute)
	waitQueued(t, admin, name, 1)
	got := acquireInBackground(t, l, name, WithFair(), WithWait(time.Minute))
	tokens := waitQueued(t, admin, name, 2)
	c.signal(t, syscall.SIGKILL)
	time.Sleep(store.QueueEntryTTL + 300*time.Millisecond)

	require.NoError(t, holder.Release(ctx))
	token, _ := holderOf(t, admin, name)
	assert.Equal(t, tokens[1], token, "the crashed waiter was skipped")
	r := requireAcquired(t, got, 5*time.Second, "the live waiter")
	require.NoError(t, r.lease.Release(ctx))
}

// The grant's message is lost: its waiter still gets the lock, by its
// keep-alive, within the keep-alive's interval and well before the lock's
// TTL. Lost with the subscription's connection (the proxy drops the message
// and closes the connection), or never sent (an ACL without the channel).
func TestFairGrantWithoutItsMessage(t *testing.T) {
	t.Parallel()
	t.Run("subscription dropped", func(t *testing.T) {
		t.Parallel()
		e := newFairEnv(t, nil, nil)
		srv, admin, proxy, holders, waiters := e.srv, e.admin, e.proxy, e.near, e.far
		name := uniqueName(t)
		holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)

		kept := make(chan struct{}, 1)
		e.farHook.set(nil, keptAlive(kept))
		got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		tokens := waitQueued(t, admin, name, 1)
		waitSubscribed(t, srv, name)
		subscriber := pubsubIDs(t, srv)
		require.Len(t, subscriber, 1)
		// Right after a keep-alive's reply, the next thing the waiter's
		// connections carry is the grant's message: drop it.
		waitKeptAlive(t, kept)
		proxy.DropNextReply()
		require.NoError(t, holder.Release(ctx))
		token, _ := holderOf(t, admin, name)
		require.Equal(t, tokens[0], token)

		r := requireAcquired(t, got, 5*time.Second, "the waiter whose grant message was lost")
		assert.Equal(t, tokens[0], r.lease.Token())
		assert.NotContains(t, pubsubIDs(t, srv), subscriber[0], "the message was dropped with its connection")
		require.NoError(t, r.lease.Release(ctx))
	})
	t.Run("never published", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		admin := srv.Client(nil)
		_, err := srv.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "resetchannels", "+@all")
		require.NoError(t, err)
		holders := lockerFor(t, srv.Client(&redis.Options{Username: "app", Password: "pw"}), nil)
		waiters := lockerFor(t, srv.Client(nil), nil)
		name := uniqueName(t)
		holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		tokens := waitQueued(t, admin, name, 1)
		require.NoError(t, holder.Release(ctx), "released, though its message could not be published")
		token, _ := holderOf(t, admin, name)
		require.Equal(t, tokens[0], token)
		r := requireAcquired(t, got, 3*time.Second, "the waiter whose grant was never published")
		require.NoError(t, r.lease.Release(ctx))
	})
}

// pubsubIDs returns the ids of srv's connections in pub/sub mode.
func pubsubIDs(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	v, err := srv.Do("CLIENT", "LIST", "TYPE", "pubsub")
	require.NoError(t, err)
	list, _ := v.(string)
	var ids []string
	for line := range strings.Lines(list) {
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// A waiter whose wait ends just as the release grants it the lock (its link
// is cut, so it does not hear of the grant) gives the lock back, which hands
// it to the next waiter: no lock is left with nobody for its TTL.
func TestFairWaiterGivingUpPassesTheLockOn(t *testing.T) {
	t.Parallel()
	e := newFairEnv(t, nil, &Options{ReleaseTimeout: 200 * time.Millisecond})
	admin, proxy, la, lb := e.admin, e.proxy, e.far, e.near
	name := uniqueName(t)
	holder, err := lb.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	aGot := make(chan error, 1)
	go func() {
		lease, err := la.Acquire(actx, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		if lease != nil {
			_ = lease.Release(ctx)
		}
		aGot <- err
	}()
	waitQueued(t, admin, name, 1)
	bGot := acquireInBackground(t, lb, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
	tokens := waitQueued(t, admin, name, 2)

	proxy.SetMode(redistest.BlackHole)
	require.NoError(t, holder.Release(ctx))
	token, _ := holderOf(t, admin, name)
	require.Equal(t, tokens[0], token, "granted to a")
	cancel()
	select {
	case err := <-aGot:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Second):
		t.Fatal("a's Acquire outlived its context")
	}
	proxy.SetMode(redistest.Pass)

	r := requireAcquired(t, bGot, 10*time.Second, "b, after a gave the lock back")
	assert.Equal(t, tokens[1], r.lease.Token())
	require.NoError(t, r.lease.Release(ctx))
	require.NoError(t, la.Close())
	n, err := admin.Exists(ctx, "lock:{"+name+"}", "lock:{"+name+"}:q", "lock:{"+name+"}:qi").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left")
}

// Property: whatever the moment each waiter gives up, once every Acquire
// has returned and every lease was released, nobody holds the lock: none
// was left with a waiter that gave up.
func TestFairGivingUpLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	lockers := []*Locker{e.locker(t, nil), lockerFor(t, e.srv.Client(nil), nil), lockerFor(t, e.srv.Client(nil), nil)}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 17))
	name := uniqueName(t)
	var obtained, gaveUp atomic.Int32
	for range 8 {
		holder, err := lockers[0].Acquire(ctx, name, WithTTL(time.Minute), WithWait(10*time.Second))
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 16 {
			l := lockers[rng.IntN(len(lockers))]
			wait := time.Duration(rng.IntN(40_000)) * time.Microsecond
			hold := time.Duration(rng.IntN(1000)) * time.Microsecond
			wg.Go(func() {
				lease, err := l.Acquire(ctx, name, WithFair(), WithWait(wait), WithTTL(time.Minute))
				if err != nil {
					assert.ErrorIs(t, err, ErrNotObtained)
					gaveUp.Add(1)
					return
				}
				obtained.Add(1)
				time.Sleep(hold)
				assert.NoError(t, lease.Release(ctx))
			})
		}
		time.Sleep(time.Duration(rng.IntN(20_000)) * time.Microsecond)
		require.NoError(t, holder.Release(ctx))
		wg.Wait()
		require.Eventually(t, func() bool {
			token, _ := holderOf(t, e.admin, name)
			return token == ""
		}, 5*time.Second, time.Millisecond, "a lock left held after every waiter returned")
	}
	t.Logf("%d obtained, %d gave up", obtained.Load(), gaveUp.Load())
	assert.Positive(t, obtained.Load())
	assert.Positive(t, gaveUp.Load())
}

// A plain Acquire does not jump the line: with the lock free and a fair
// waiter in line it finds the lock busy, and a plain waiting Acquire gets
// the lock only after the fair waiter released it.
func TestFairPlainAcquireDoesNotJumpTheQueue(t *testing.T) {
	t.Parallel()
	// Plain waiters poll slowly: only a wake-up makes them try soon.
	e := newFairEnv(t, slowPolling, nil)
	srv, admin, proxy, plain, fair := e.srv, e.admin, e.proxy, e.near, e.far
	var attempts atomic.Int32
	e.nearHook.set(countAttempts(&attempts), nil)
	name := uniqueName(t)
	_, err := plain.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	got := acquireInBackground(t, fair, name, WithFair(), WithWait(time.Minute))
	tokens := waitQueued(t, admin, name, 1)

	// The holder's lock is gone without a release (as if expired), and the
	// fair waiter is silent for now: its entry lives on.
	proxy.SetMode(redistest.BlackHole)
	require.NoError(t, admin.Del(ctx, "lock:{"+name+"}").Err())
	_, err = plain.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "fair waiters in line", busy.Owner)
	assert.Contains(t, err.Error(), "fair waiters in line")
	proxy.SetMode(redistest.Pass)

	r := requireAcquired(t, got, 5*time.Second, "the fair waiter takes the free lock")
	assert.Equal(t, tokens[0], r.lease.Token())
	plainGot := acquireInBackground(t, plain, name, WithWait(time.Minute))
	second := acquireInBackground(t, fair, name, WithFair(), WithWait(time.Minute))
	waitQueued(t, admin, name, 1)
	require.Eventually(t, func() bool { return shardSubscribers(t, srv, "lock:{"+name+"}") == 2 },
		10*time.Second, time.Millisecond, "both waiters subscribed")
	time.Sleep(100 * time.Millisecond)
	before := attempts.Load()
	require.NoError(t, r.lease.Release(ctx))
	r2 := requireAcquired(t, second, 5*time.Second, "the second fair waiter, granted the lock")
	time.Sleep(100 * time.Millisecond)
	select {
	case p := <-plainGot:
		t.Fatalf("a plain waiter took the lock from the fair one: %v", p.err)
	default:
	}
	assert.Equal(t, before, attempts.Load(), "the plain waiter is not woken by a grant")
	require.NoError(t, r2.lease.Release(ctx))
	requireAcquired(t, plainGot, 5*time.Second, "the plain waiter after the line emptied")
}

// The queue and the lock share the name's hash tag: fair waiting works on a
// Cluster.
func TestFairCluster(t *testing.T) {
	t.Parallel()
	srv := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = client.Close() })
	l := lockerFor(t, client, nil)
	for _, name := range []string{"settlement", "order:42"} {
		checkServedInOrder(t, l, client, name)
	}
}

// checkServedInOrder queues three fair waiters for name behind a holder, 1ms
// apart, and checks that they are served in that order (each one's lease is
// awaited, and released, in turn), with increasing fences.
func checkServedInOrder(t *testing.T, l *Locker, c redis.UniversalClient, name string) {
	t.Helper()
	holder, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	var got []<-chan acquired
	for i := range 3 {
		got = append(got, acquireInBackground(t, l, name, WithFair(), WithWait(time.Minute)))
		require.Eventually(t, func() bool {
			n, err := c.ZCard(ctx, "lock:{"+name+"}:q").Result()
			return err == nil && n == int64(i+1)
		}, 10*time.Second, time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, holder.Release(ctx))
	last := holder.Fence()
	for i, g := range got {
		r := requireAcquired(t, g, 10*time.Second, fmt.Sprintf("%s: waiter %d", name, i))
		assert.Greater(t, r.lease.Fence(), last)
		last = r.lease.Fence()
		require.NoError(t, r.lease.Release(ctx))
	}
}

// Redlock rejects WithFair, with or without WithWait.
func TestFairRedlockInvalid(t *testing.T) {
	t.Parallel()
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	for _, opts := range [][]Option{{WithFair()}, {WithFair(), WithWait(time.Second)}} {
		_, err := l.Acquire(ctx, uniqueName(t), opts...)
		require.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), "WithFair")
		err = l.RunWithLock(ctx, uniqueName(t), func(context.Context, *Lease) error { return nil }, opts...)
		require.ErrorIs(t, err, ErrInvalid)
	}
	for _, h := range e.hooks {
		assert.Zero(t, h.calls.Load(), "no Redis call")
	}
}

// Fair waiting on miniredis, as the examples run it.
func TestFairMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	checkServedInOrder(t, lockerFor(t, c, nil), c, "job")
}

// With Options.Replicas, a lock handed over by a release counts only once
// replicas have it, as an acquisition does: the release that granted it did
// not WAIT. Short of replicas, the waiter passes it on and waits on; when
// its wait ends, Acquire fails as an acquisition short of replicas does,
// and nothing is left held.
func TestFairGrantWaitsForReplicas(t *testing.T) {
	t.Parallel()
	master, rs, holders, admin := replicated(t, 2, nil)
	attempts := &scriptCount{name: "acquire"}
	client := master.Client(nil)
	client.AddHook(attempts)
	waiters := lockerFor(t, client, &Options{Replicas: 2, ReplicaTimeout: 50 * time.Millisecond})

	t.Run("acknowledged", func(t *testing.T) {
		name := uniqueName(t)
		holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		waitQueued(t, admin, name, 1)
		require.NoError(t, holder.Release(ctx))
		r := requireAcquired(t, got, 5*time.Second, "the waiter the release handed the lock to")
		for i, replica := range rs {
			v, err := replica.Do("GET", r.lease.Key())
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(v.(string), r.lease.Token()+" "), "replica %d has the lock when Acquire returns", i)
		}
		require.NoError(t, r.lease.Release(ctx))
	})
	t.Run("short", func(t *testing.T) {
		name := uniqueName(t)
		holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Second), WithTTL(time.Minute))
		waitQueued(t, admin, name, 1)
		rs[1].Pause() // only one replica can acknowledge
		t.Cleanup(rs[1].Resume)
		attempts.n.Store(0)
		require.NoError(t, holder.Release(ctx))
		r := <-got
		require.ErrorIs(t, r.err, ErrUnavailable, "a grant that one of two replicas acknowledged is not a lock")
		assert.Contains(t, r.err.Error(), "1 of 2 replicas acknowledged")
		// Each lock short of replicas is given back and released, which
		// wakes the waiter; retrying at once would take the lock again
		// and again (about every 125ms here), and could find the last
		// one not yet given back, and call it busy.
		assert.LessOrEqual(t, attempts.n.Load(), int64(2), "after a grant short of replicas, the next attempt comes after a pause")
		key, _ := waiters.keys(name)
		require.Eventually(t, func() bool { return admin.Exists(ctx, key).Val() == 0 }, 5*time.Second, time.Millisecond,
			"the grant is given back")
		assert.Empty(t, queued(t, admin, name), "the waiter left the line")
	})
}

// scriptCount is a go-redis hook that counts the calls of one of our
// scripts, alone or in a pipeline (with Replicas, a script is sent with its
// WAIT).
type scriptCount struct {
	name string
	n    atomic.Int64
}

func (*scriptCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == h.name {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *scriptCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if scriptName(cmd) == h.name {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A holder that neither releases nor renews (it crashed) hands nothing
// over: its lock expires. The first fair waiter asks the server when the
// holder's PTTL runs out, not at its next keep-alive (every 500 ms for a
// TTL of a minute), and takes the lock.
func TestFairWaiterNoticesAnExpiredHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	_, err := l.Acquire(ctx, name, WithTTL(100*time.Millisecond)) // never released
	require.NoError(t, err)
	key, _ := l.keys(name)
	pttl, err := e.admin.PTTL(ctx, key).Result()
	require.NoError(t, err)
	expiry := time.Now().Add(pttl)
	got := acquireInBackground(t, l, name, WithFair(), WithWait(5*time.Second), WithTTL(time.Minute))
	r := requireAcquired(t, got, 5*time.Second, "the waiter behind an expired holder")
	late := r.at.Sub(expiry)
	t.Logf("obtained %v after the holder's expiry", late)
	assert.Less(t, late, keepAliveEvery(time.Minute)*2/5, "asked at the expiry, not at the next keep-alive")
	require.NoError(t, r.lease.Release(ctx))
}

// A waiter paused past its grant's expiry renews the grant when it resumes
// (TestFairDeadlineBoundPausedWaiter). With Redis hung at that moment, and
// go-redis's default options (no ContextTimeoutEnabled: a hung read lasts
// ReadTimeout, and is retried), Acquire still returns by its context's
// deadline.
func TestFairLateGrantRenewalReturnsByTheDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(nil)
	holders := lockerFor(t, admin, nil)
	name := uniqueName(t)
	holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	c := startFairChild(t, srv, name, time.Second, 5*time.Second)
	tokens := waitQueued(t, admin, name, 1)
	waitSubscribed(t, srv, name)
	c.signal(t, syscall.SIGSTOP)
	require.NoError(t, holder.Release(ctx))
	token, _ := holderOf(t, admin, name)
	require.Equal(t, tokens[0], token, "granted to the paused waiter")
	time.Sleep(1500 * time.Millisecond) // the grant expires
	srv.Pause()
	t.Cleanup(srv.Resume)
	c.signal(t, syscall.SIGCONT) // it learns of the grant, too late: it renews, on a hung Redis
	select {
	case <-c.done:
		t.Fatalf("the child exited early: %s", &c.out)
	case <-time.After(5 * time.Second): // past the child's deadline
	}
	srv.Resume()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not exit")
	}
	f := strings.Fields(strings.TrimSpace(c.out.String()))
	require.GreaterOrEqual(t, len(f), 2, "child: %s", &c.out)
	require.Equal(t, "late", f[0], "child: %s", &c.out)
	late, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	t.Logf("Acquire returned %dµs after its deadline: %s", late, &c.out)
	assert.Less(t, late, int64(300_000), "Acquire returned by its deadline")
}

// The first attempt's reply is lost after the attempt joined the line, and
// the release's grant message comes before the waiter tries again: the
// grant counts, from a time before the token existed, not from the zero
// time. Before, the lease's acquisition time was year 1, and MaxHold ended
// its KeepAlive context at once.
func TestFairGrantAfterAnUncertainFirstAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, &Options{MinRetryBackoff: time.Minute, MaxRetryBackoff: time.Minute, MaxHold: time.Hour})
	holders := lockerFor(t, e.admin, nil)
	name := uniqueName(t)
	holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	// A plain waiter of the same Locker keeps the channel subscribed, so
	// that the fair waiter hears the grant.
	_ = acquireInBackground(t, l, name, WithWait(time.Minute))
	waitSubscribed(t, e.srv, name)
	var once atomic.Bool
	lost := make(chan struct{})
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		// The fair waiter's attempt, not the plain waiter's on its
		// subscription's confirmation, which may come now on a busy
		// machine: a fair attempt's arguments end in "1" and its entry's TTL.
		args := cmd.Args()
		fair := len(args) > 2 && fmt.Sprint(args[len(args)-2]) == "1"
		if scriptName(cmd) == "acquire" && fair && once.CompareAndSwap(false, true) {
			close(lost)
			return errReplyLost
		}
		return nil
	})
	start := time.Now()
	got := acquireInBackground(t, l, name, WithFair(), WithWait(time.Minute), WithTTL(time.Second))
	<-lost
	require.NoError(t, holder.Release(ctx))
	r := requireAcquired(t, got, 5*time.Second, "the grant after a lost first reply")
	assert.False(t, r.lease.acquired.Before(start.Add(-time.Second)), "acquired at %v", r.lease.acquired)
	work := r.lease.KeepAlive(ctx)
	select {
	case <-work.Done():
		t.Fatalf("the work's context ended after %v with MaxHold 1h: %v", time.Since(r.at), context.Cause(work))
	case <-time.After(2 * time.Second):
	}
	require.NoError(t, r.lease.Release(ctx))
}

// A waiter whose entry is gone tries again; when its attempts fail (here
// OOM), it pauses between them. Before, it sent an attempt and a keep-alive
// back to back: over a thousand of each a second.
func TestFairFailingAttemptsArePaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	holders := lockerFor(t, e.admin, nil)
	name := uniqueName(t)
	_, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	got := waitInLine(t, e, l, name, WithWait(3*time.Second), WithTTL(time.Minute))
	var attempts, keeps atomic.Int32
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		switch scriptName(cmd) {
		case "acquire":
			attempts.Add(1)
			return testRedisError("OOM command not allowed when used memory > 'maxmemory'.")
		case "queue":
			keeps.Add(1)
		}
		return nil
	}, nil)
	require.NoError(t, e.admin.Del(ctx, "lock:{"+name+"}:q", "lock:{"+name+"}:qi").Err()) // the entry is gone
	time.Sleep(time.Second)
	n, k := attempts.Load(), keeps.Load()
	t.Logf("in 1s: %d attempts, %d keep-alives", n, k)
	assert.LessOrEqual(t, n+k, int32(20), "requests to a Redis that refuses them")
	r := <-got
	// The holder the first attempt found holds the lock for a minute: the
	// refusals after it are no reason to call the lock unavailable (nor to
	// fail open beside that holder).
	require.ErrorIs(t, r.err, ErrNotObtained)
	assert.NotErrorIs(t, r.err, ErrUnavailable)
}

// A grant's message counts while the waiter's own keep-alive is still in
// flight (here held back until the test ends): the waiter does not wait
// for its answer. The lease is then its caller's, who may extend it while
// that keep-alive is still out.
func TestFairGrantWhileKeepAliveInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	holders := lockerFor(t, e.admin, nil)
	name := uniqueName(t)
	holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	got := waitInLine(t, e, l, name, WithWait(time.Minute), WithTTL(time.Minute))
	unblock := make(chan struct{})
	held := make(chan struct{}, 1)
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "queue" {
			select {
			case held <- struct{}{}:
			default:
			}
			<-unblock
		}
		return nil
	}, nil)
	defer e.hook.set(nil, nil)
	defer close(unblock)
	select {
	case <-held: // a keep-alive is in flight
	case <-time.After(5 * time.Second):
		t.Fatal("no keep-alive")
	}
	require.NoError(t, holder.Release(ctx))
	r := requireAcquired(t, got, 2*time.Second, "the grant, with a keep-alive in flight")
	require.NoError(t, r.lease.Extend(ctx, 2*time.Minute))
	require.NoError(t, r.lease.Release(ctx))
}

// A fair waiter of a lock with a short TTL asks every third of it, so that
// the time its grant's Deadline counts from is recent: 10 or so keep-alives
// in a second for a TTL of 300ms, where a TTL of a minute gets 2.
func TestFairKeepAliveEveryThirdOfTheTTL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ttl      time.Duration
		min, max int32
	}{
		{300 * time.Millisecond, 6, 14},
		{time.Minute, 1, 4},
	} {
		t.Run(tc.ttl.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			l := e.locker(t, nil)
			name := uniqueName(t)
			_, err := l.Acquire(ctx, name, WithTTL(time.Minute))
			require.NoError(t, err)
			got := waitInLine(t, e, l, name, WithWait(time.Minute), WithTTL(tc.ttl))
			time.Sleep(100 * time.Millisecond) // past the keep-alive sent on the subscription's confirmation
			var keeps atomic.Int32
			e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
				if scriptName(cmd) == "queue" {
					keeps.Add(1)
				}
				return nil
			}, nil)
			time.Sleep(time.Second)
			n := keeps.Load()
			t.Logf("TTL %v: %d keep-alives in 1s", tc.ttl, n)
			assert.GreaterOrEqual(t, n, tc.min)
			assert.LessOrEqual(t, n, tc.max)
			select {
			case r := <-got:
				t.Fatalf("acquired or gave up: %v", r.err)
			default:
			}
		})
	}
}

// A grant found by a keep-alive (its message never published: the
// holder's ACL has no channels) counts from that keep-alive's send time
// plus the TTL left it read, when that is later than the last answer
// "waiting": here the release comes about 400ms after a keep-alive, just
// before the next one, and the lease's Deadline is still a whole TTL (less
// the drift allowance) after the release, and before the server's expiry.
func TestFairGrantFoundByKeepAliveCountsFromIt(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(nil)
	_, err := srv.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "resetchannels", "+@all")
	require.NoError(t, err)
	holders := lockerFor(t, srv.Client(&redis.Options{Username: "app", Password: "pw"}), nil)
	wc := srv.Client(nil)
	hook := &faultHook{}
	wc.AddHook(hook)
	waiters := lockerFor(t, wc, nil)
	const ttl = 3 * time.Second // keep-alives every 500ms
	name := uniqueName(t)
	holder, err := holders.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	kept := make(chan struct{}, 1)
	hook.set(nil, keptAlive(kept))
	got := acquireInBackground(t, waiters, name, WithFair(), WithWait(time.Minute), WithTTL(ttl))
	waitQueued(t, admin, name, 1)
	waitSubscribed(t, srv, name)
	time.Sleep(100 * time.Millisecond) // past the keep-alive sent on the subscription's confirmation
	waitKeptAlive(t, kept)
	time.Sleep(400 * time.Millisecond)
	released := time.Now()
	require.NoError(t, holder.Release(ctx), "released, though its message could not be published")
	r := requireAcquired(t, got, 3*time.Second, "the waiter whose grant a keep-alive found")
	pttl, err := admin.PTTL(ctx, r.lease.Key()).Result()
	require.NoError(t, err)
	expiry := time.Now().Add(pttl)
	t.Logf("Deadline %v after the release, %v before the server's expiry", r.lease.Deadline().Sub(released), expiry.Sub(r.lease.Deadline()))
	assert.Greater(t, r.lease.Deadline().Sub(released), ttl-drift(ttl)-200*time.Millisecond,
		"counted from the keep-alive that found the grant, not from the answer before it")
	assert.True(t, r.lease.Deadline().Before(expiry), "before the server's expiry")
	require.NoError(t, r.lease.Release(ctx))
}

// TestFairLateJoinWhileLeaving: a late copy of a fair waiter's join that
// reaches Redis while the waiter that gave up leaves the line (after it
// left, before its token was retired) puts it back in line; it is taken
// out again, and the next release does not grant the lock to the waiter
// that is gone (it was held for its TTL by nobody).
func TestFairLateJoinWhileLeaving(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{ReleaseTimeout: 500 * time.Millisecond})
	name := uniqueName(t)
	holder, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)

	var mu sync.Mutex
	var joinArgs []any
	late := make(chan struct{})
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		switch scriptName(cmd) {
		case "acquire":
			mu.Lock()
			if joinArgs == nil {
				joinArgs = append([]any(nil), cmd.Args()...)
			}
			mu.Unlock()
		case "queue":
			if cmd.Args()[7] == "d" {
				mu.Lock()
				a := joinArgs
				joinArgs = []any{} // once
				mu.Unlock()
				if len(a) > 0 { // the delayed copy of the first attempt arrives now
					_, err := e.admin.Do(ctx, a...).Result()
					assert.NoError(t, err)
					close(late)
				}
			}
		}
		return nil
	})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(wctx, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		done <- err
	}()
	gone := waitQueued(t, e.admin, name, 1)[0]
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	<-late
	// Out of line well before its entry would expire (2s, store.QueueEntryTTL).
	require.Eventually(t, func() bool { return len(queued(t, e.admin, name)) == 0 },
		time.Second, time.Millisecond, "the waiter that gave up is out of line")
	require.NoError(t, holder.Release(ctx))
	tok, _ := holderOf(t, e.admin, name)
	assert.NotEqual(t, gone, tok, "the lock granted to a waiter that gave up")
}

// TestFairGiveBackWakesWaiters: a fair waiter granted the lock that gave up
// before it heard of the grant gives the lock back, and that wakes the
// plain waiters (the give-back published nothing: they slept out their
// backoff with the lock free).
func TestFairGiveBackWakesWaiters(t *testing.T) {
	e := newFairEnv(t, slowPolling, nil) // a plain waiter's backoff alone would be 20s
	name := uniqueName(t)
	holder, err := e.near.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	fair := make(chan error, 1)
	go func() {
		_, err := e.far.Acquire(wctx, name, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
		fair <- err
	}()
	waitQueued(t, e.admin, name, 1)
	plain := acquireInBackground(t, e.near, name, WithWait(time.Minute))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, "lock:{"+name+"}") == 2 },
		10*time.Second, time.Millisecond, "both waiters subscribed")
	time.Sleep(100 * time.Millisecond) // the plain waiter's confirmation attempt found the lock held
	// The grant's message to the fair waiter comes 300ms late: it gives
	// up before it hears of the grant.
	e.proxy.SetLatency(300 * time.Millisecond)
	require.NoError(t, holder.Release(ctx)) // granted to the fair waiter
	cancel()
	require.ErrorIs(t, <-fair, context.Canceled, "the fair waiter gave up")
	start := time.Now()
	select {
	case r := <-plain:
		require.NoError(t, r.err)
		assert.Less(t, time.Since(start), 5*time.Second, "woken by the give-back, not the 20s backoff")
		require.NoError(t, r.lease.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("the plain waiter was not woken by the give-back")
	}
}
