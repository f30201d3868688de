package fencelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
)

// isMultiAcquire tells whether cmd runs multi_acquire.lua.
func isMultiAcquire(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	body, _ := args[1].(string)
	return body == script.MultiAcquire.Hash || body == script.MultiAcquire.Src
}

// prefixed returns name with the test's prefix, for each name.
func prefixed(t *testing.T, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = uniqueName(t) + ":" + n
	}
	return out
}

func TestAcquireAllInvalid(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	many := make([]string, maxNames+1)
	for i := range many {
		many[i] = "n" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		what  string
		names []string
		opts  []Option
	}{
		{"nil list", nil, nil},
		{"empty list", []string{}, nil},
		{"a name twice", []string{"a", "b", "a"}, nil},
		{"over 1000 names", many, nil},
		{"an empty name", []string{"a", ""}, nil},
		{"a name with a brace", []string{"a", "b{c"}, nil},
		{"WithFair", []string{"a", "b"}, []Option{WithWait(time.Second), WithFair()}},
		{"a negative wait", []string{"a"}, []Option{WithWait(-time.Second)}},
		{"a nil option", []string{"a"}, []Option{nil}},
		{"a TTL too short", []string{"a"}, []Option{WithTTL(time.Millisecond)}},
	} {
		leases, err := l.AcquireAll(ctx, tc.names, tc.opts...)
		require.ErrorIs(t, err, ErrInvalid, tc.what)
		assert.Nil(t, leases, tc.what)
		err = l.RunWithLocks(ctx, tc.names, func(context.Context, []*Lease) error { return nil }, tc.opts...)
		require.ErrorIs(t, err, ErrInvalid, tc.what)
	}
	require.ErrorIs(t, l.RunWithLocks(ctx, []string{"a"}, nil), ErrInvalid)
	var zero Locker
	_, err := zero.AcquireAll(ctx, []string{"a"})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Zero(t, e.hook.calls.Load(), "no Redis call")

	// 1000 names is the most, and fine.
	leases, err := l.AcquireAll(ctx, many[:maxNames])
	require.NoError(t, err)
	require.Len(t, leases, maxNames)
	for _, lease := range leases {
		require.NoError(t, lease.Release(ctx))
	}
}

// The names are taken in one script: each lease is an ordinary lock lease
// (a plain Acquire, of this version or of an older one, finds the name
// held), and when one name is busy nothing at all is written.
func TestAcquireAllTogether(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{Owner: "batch"})
	names := prefixed(t, "c", "a", "b")
	before, err := l.Acquire(ctx, names[1])
	require.NoError(t, err)
	require.NoError(t, before.Release(ctx))

	leases, err := l.AcquireAll(ctx, names)
	require.NoError(t, err)
	require.Len(t, leases, 3)
	for i, lease := range leases {
		assert.Equal(t, names[i], lease.Name(), "in the order given")
		assert.Positive(t, lease.Fence())
		assert.True(t, lease.Deadline().After(time.Now()))
		v, err := e.admin.Get(ctx, lease.Key()).Result()
		require.NoError(t, err)
		assert.Equal(t, lease.Token()+" "+strconv.FormatInt(lease.Fence(), 10)+" batch", v, "acquire.lua's value")
		_, err = l.Acquire(ctx, lease.Name())
		var busy *BusyError
		require.ErrorAs(t, err, &busy)
		assert.Equal(t, "batch", busy.Owner)
		old := newCompatSide(t, e.admin, true, lease.Name())
		reply, err := old.acquire(ctx, "old-token", "old", false)
		require.NoError(t, err)
		assert.Equal(t, int64(0), reply.([]any)[0], "an older version's Acquire finds %s held", lease.Name())
	}
	assert.Greater(t, leases[1].Fence(), before.Fence(), "the name's fences go on increasing")
	tokens := map[string]bool{}
	for _, lease := range leases {
		tokens[lease.Token()] = true
	}
	assert.Len(t, tokens, 3, "a token per lease")

	// Each lease lives on its own.
	require.NoError(t, leases[0].Extend(ctx, time.Minute))
	require.NoError(t, leases[2].Release(ctx))
	info, err := l.Inspect(ctx, names[2])
	require.NoError(t, err)
	assert.False(t, info.Held)
	for _, lease := range leases[:2] {
		require.NoError(t, lease.Release(ctx))
	}

	// One busy name: ErrNotObtained naming it, and the others untouched.
	other := e.locker(t, &Options{Owner: "other"})
	held, err := other.Acquire(ctx, names[2], WithTTL(time.Minute))
	require.NoError(t, err)
	calls := e.hook.calls.Load()
	_, err = l.AcquireAll(ctx, names)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, names[2], busy.Name)
	assert.Equal(t, "other", busy.Owner)
	assert.Positive(t, busy.TTL)
	assert.Equal(t, int64(1), e.hook.calls.Load()-calls, "one script")
	for _, name := range []string{names[0], names[1]} {
		lock, fenceKey := l.keys(name)
		n, err := e.admin.Exists(ctx, lock).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s not taken", name)
		v, err := e.admin.Get(ctx, fenceKey).Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(map[string]int64{names[0]: leases[0].Fence(), names[1]: leases[1].Fence()}[name], 10), v,
			"%s's counter untouched", name)
	}
	require.NoError(t, held.Release(ctx))
	requireEveryKeyExpires(t, e.admin)
}

// requireEveryKeyExpires checks that every key of the server has a TTL.
func requireEveryKeyExpires(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	check := func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			pttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			if pttl == -1 {
				return fmt.Errorf("key %s has no TTL", k)
			}
		}
		return nil
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	}
	require.NoError(t, err)
}

// A waiting AcquireAll is woken by the release of the name it found busy:
// the Locker's backoff is 20s, the wait only a push can end this soon.
func TestAcquireAllWaitIsWoken(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling)
	names := prefixed(t, "a", "b", "c")
	held, err := l.Acquire(ctx, names[2], WithTTL(time.Minute))
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		leases, err := l.AcquireAll(ctx, names, WithWait(time.Minute))
		for _, lease := range leases {
			if err == nil {
				err = lease.Release(ctx)
			}
		}
		got <- err
	}()
	lock, _ := l.keys(names[2])
	require.Eventually(t, func() bool {
		n, err := e.admin.PubSubShardNumSub(ctx, lock).Result()
		return err == nil && n[lock] == 1
	}, 5*time.Second, time.Millisecond, "the waiter subscribes to the busy name's channel")
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 10*time.Second, "no wake-up")

	// A wait that runs out returns the busy name, having taken nothing.
	held, err = l.Acquire(ctx, names[0], WithTTL(time.Minute))
	require.NoError(t, err)
	_, err = l.AcquireAll(ctx, names, WithWait(50*time.Millisecond))
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, names[0], busy.Name)
	for _, name := range names[1:] {
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		assert.False(t, info.Held, name)
	}
	require.NoError(t, held.Release(ctx))
}

// An attempt whose reply was lost may have taken every name: the clean-up
// gives them back, and a late copy of the attempt takes nothing.
func TestAcquireAllUnknownOutcomeIsMadeHarmless(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	names := prefixed(t, "a", "b")
	var lost atomic.Pointer[[]any]
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if isMultiAcquire(cmd) && lost.Load() == nil {
			args := slices.Clone(cmd.Args())
			lost.Store(&args)
			return errReplyLost
		}
		return nil
	})
	_, err := l.AcquireAll(ctx, names)
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotNil(t, lost.Load())
	for _, name := range names {
		require.Eventually(t, func() bool {
			info, err := l.Inspect(ctx, name)
			return err == nil && !info.Held
		}, 5*time.Second, time.Millisecond, "%s given back", name)
	}
	// The attempt arrives again, late (as go-redis may resend it).
	late := *lost.Load()
	late[0], late[1] = "eval", script.MultiAcquire.Src
	reply, err := e.admin.Do(ctx, late...).Result()
	require.NoError(t, err)
	assert.Equal(t, []any{int64(2)}, reply, "the tokens are retired")
	for _, name := range names {
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		assert.False(t, info.Held, name)
	}
	requireEveryKeyExpires(t, e.admin)
}

// Taken one by one (on a Redlock, as on a Cluster when the names hash to
// several slots): a busy name makes the call give back those it took
// before it returns.
func TestAcquireAllInOrderGivesBack(t *testing.T) {
	r := newRedlockEnv(t, 3, nil)
	l := r.locker(t, nil)
	other := r.locker(t, &Options{Owner: "other"})
	names := prefixed(t, "z", "a", "m")
	leases, err := l.AcquireAll(ctx, names)
	require.NoError(t, err)
	for i, lease := range leases {
		assert.Equal(t, names[i], lease.Name())
		assert.Positive(t, lease.Fence())
		require.NoError(t, lease.Release(ctx))
	}

	held, err := other.Acquire(ctx, names[2], WithTTL(time.Minute))
	require.NoError(t, err)
	_, err = l.AcquireAll(ctx, names)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, names[2], busy.Name)
	// At once, no Eventually: the release came before the return.
	info, err := l.Inspect(ctx, names[1])
	require.NoError(t, err)
	assert.False(t, info.Held, "the name taken first was given back")
	assert.Positive(t, info.LastFence, "it was taken")
	info, err = l.Inspect(ctx, names[0])
	require.NoError(t, err)
	assert.False(t, info.Held)
	require.NoError(t, held.Release(ctx))

	// Waiting for a later name keeps the earlier ones alive past their TTL.
	held, err = other.Acquire(ctx, names[0], WithTTL(time.Minute))
	require.NoError(t, err)
	got := make(chan []*Lease, 1)
	go func() {
		leases, err := l.AcquireAll(ctx, names, WithWait(time.Minute), WithTTL(300*time.Millisecond))
		assert.NoError(t, err)
		got <- leases
	}()
	time.Sleep(time.Second) // over three TTLs of the names taken first
	require.NoError(t, held.Release(ctx))
	leases = <-got
	require.Len(t, leases, 3)
	for _, lease := range leases {
		require.NoError(t, lease.Release(ctx), "%s still held", lease.Name())
	}
}

// The property: sets of names that overlap, taken from 8 goroutines in 4
// Lockers, never wait for each other for ever and never hold one name
// twice at once; each name's fences increase.
func TestAcquireAllOverlappingSetsOneNode(t *testing.T) {
	e := newEnv(t, nil)
	var lockers []*Locker
	for range 4 {
		lockers = append(lockers, e.locker(t, nil))
	}
	overlappingSets(t, lockers, prefixed(t, "a", "b", "c", "d", "e", "f"))
	requireEveryKeyExpires(t, e.admin)
}

func TestAcquireAllOverlappingSetsCluster(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	var lockers []*Locker
	var client *redis.ClusterClient
	for range 4 {
		client = c.Client(nil)
		l, err := New(client, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		lockers = append(lockers, l)
	}
	names := prefixed(t, "a", "b", "c", "d", "e")
	// A sixth name in the slot of the first: a set of those two is taken in
	// one script, the others one by one.
	slotOf := func(name string) int64 {
		slot, err := client.ClusterKeySlot(ctx, "x{"+name+"}").Result()
		require.NoError(t, err)
		return slot
	}
	for i := 0; ; i++ {
		if n := names[0] + ":" + strconv.Itoa(i); slotOf(n) == slotOf(names[0]) {
			names = append(names, n)
			break
		}
	}
	slots := map[int64]bool{}
	for _, name := range names {
		slots[slotOf(name)] = true
	}
	require.Greater(t, len(slots), 2, "the names span slots")
	overlappingSets(t, lockers, names)
	requireEveryKeyExpires(t, client)
}

func overlappingSets(t *testing.T, lockers []*Locker, names []string) {
	t.Helper()
	var (
		inUse  = make([]atomic.Int32, len(names))
		mu     sync.Mutex
		fences = make([]int64, len(names)) // guarded by mu
		failed = make(chan error, 64)
		wg     sync.WaitGroup
		done   atomic.Int64
	)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	index := map[string]int{}
	for i, n := range names {
		index[n] = i
	}
	const rounds = 15
	for g := range 8 {
		l := lockers[g%len(lockers)]
		rng := rand.New(rand.NewPCG(uint64(g), 7))
		wg.Go(func() {
			for range rounds {
				set := slices.Clone(names)
				rng.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
				set = set[:2+rng.IntN(3)]
				err := l.RunWithLocks(ctx, set, func(ctx context.Context, leases []*Lease) error {
					for _, lease := range leases {
						i := index[lease.Name()]
						if n := inUse[i].Add(1); n != 1 {
							fail(fmt.Errorf("%s held %d times at once", lease.Name(), n))
						}
						mu.Lock()
						if lease.Fence() <= fences[i] {
							fail(fmt.Errorf("%s: fence %d after %d", lease.Name(), lease.Fence(), fences[i]))
						}
						fences[i] = lease.Fence()
						mu.Unlock()
					}
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					for _, lease := range leases {
						inUse[index[lease.Name()]].Add(-1)
					}
					return ctx.Err()
				}, WithWait(20*time.Second), WithTTL(2*time.Second))
				if err != nil {
					fail(fmt.Errorf("%v: %w", set, err)) // a wait of 20s that ran out: a deadlock
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Error(err)
	}
	assert.Equal(t, int64(8*rounds), done.Load())
}

// RunWithLocks cancels the work when one of its leases is lost, and
// releases them all after it.
func TestRunWithLocksLoss(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	names := prefixed(t, "a", "b", "c")
	err := l.RunWithLocks(ctx, names, func(ctx context.Context, leases []*Lease) error {
		require.Len(t, leases, 3)
		for i, lease := range leases {
			assert.Equal(t, names[i], lease.Name())
		}
		require.NoError(t, e.admin.Del(ctx, leases[1].Key()).Err()) // taken away
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Error("work not cancelled")
		}
		assert.ErrorIs(t, context.Cause(ctx), ErrLost)
		return nil
	}, WithTTL(150*time.Millisecond))
	require.ErrorIs(t, err, ErrLost)
	for _, name := range names {
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		assert.False(t, info.Held, name)
	}

	// Released after work, also when it panics; work's error is returned.
	// The work outlives the TTL, renewed every third of it: a TTL of 2s
	// leaves the renewals 1.3s to get through on a busy machine (at 150ms,
	// a pause of 100ms lost the leases).
	errWork := errors.New("work failed")
	const ttl = 2 * time.Second
	err = l.RunWithLocks(ctx, names, func(ctx context.Context, leases []*Lease) error {
		time.Sleep(ttl + ttl/4) // renewed past the TTL
		return errWork
	}, WithTTL(ttl))
	require.ErrorIs(t, err, errWork)
	require.NotErrorIs(t, err, ErrLost)
	func() {
		defer func() { assert.NotNil(t, recover()) }()
		_ = l.RunWithLocks(ctx, names, func(context.Context, []*Lease) error { panic("work panics") })
	}()
	for _, name := range names {
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		assert.False(t, info.Held, name)
	}
	requireEveryKeyExpires(t, e.admin)
}

// TestTogether: one script takes several locks on one server, or when
// their names share a Cluster slot; a Ring's shards are its own hash's.
func TestTogether(t *testing.T) {
	assert.True(t, together(notify.Cluster, "", []string{"123456789", "123456789"}))
	assert.True(t, together(notify.Cluster, "{p}", []string{"foo", "bar"}))
	assert.False(t, together(notify.Cluster, "", []string{"foo", "bar"}))
	assert.True(t, together(notify.Ring, "", []string{"foo"}))
	assert.False(t, together(notify.Ring, "", []string{"foo", "bar"}))
	assert.True(t, together(notify.Single, "", []string{"foo", "bar"}))
}
