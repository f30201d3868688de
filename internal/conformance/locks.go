package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// standalone: Acquire, Extend, Release and RunWithLock on one server; fences
// strictly increase; a held lock is ErrNotObtained; the work's context ends
// when the lock is deleted from under it.
func (s *suite) standalone(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	ctx := callCtx(t)
	name := nameOf(t, "")

	var last int64
	for i := range 3 {
		lease, err := l.Acquire(ctx, name, fencelock.WithOwner("conformance"))
		require.NoError(t, err, "Acquire %d", i)
		assert.Equal(t, name, lease.Name())
		assert.Greater(t, lease.Fence(), last, "fences strictly increase")
		last = lease.Fence()

		_, err = l.Acquire(ctx, name)
		requireBusy(t, err, "Acquire of a held lock")
		var busy *fencelock.BusyError
		if assert.ErrorAs(t, err, &busy) {
			assert.Equal(t, "conformance", busy.Owner, "BusyError names the holder")
			assert.Positive(t, busy.TTL, "BusyError's TTL")
		}

		require.NoError(t, lease.Extend(ctx, 10*time.Minute), "Extend")
		ttl, err := lease.TTL(ctx)
		require.NoError(t, err, "Lease.TTL")
		assert.Greater(t, ttl, time.Minute, "extended beyond the default 30s")
		assert.LessOrEqual(t, ttl, 10*time.Minute)
		require.NoError(t, lease.Release(ctx), "Release")
		assert.False(t, keyExists(t, srv, lease.Key()), "released: the key is gone")
		assert.ErrorIs(t, lease.Extend(ctx, time.Minute), fencelock.ErrNotHeld, "Extend after Release")
	}

	// RunWithLock: the work holds the lock, which is released after it.
	var key string
	require.NoError(t, l.RunWithLock(ctx, name, func(ctx context.Context, lease *fencelock.Lease) error {
		key = lease.Key()
		assert.Greater(t, lease.Fence(), last)
		last = lease.Fence()
		assert.True(t, keyExists(t, srv, key), "held while the work runs")
		_, err := l.Acquire(ctx, name)
		requireBusy(t, err, "Acquire while RunWithLock's work runs")
		return nil
	}))
	assert.False(t, keyExists(t, srv, key), "released after the work")

	werr := errors.New("the work's error")
	err := l.RunWithLock(ctx, name, func(context.Context, *fencelock.Lease) error { return werr })
	require.ErrorIs(t, err, werr, "RunWithLock returns the work's error")

	// The lock deleted from under the work: the watchdog's next renewal
	// (every RenewInterval, 100ms) finds it gone and cancels the work's
	// context, long before the lease's 30s TTL runs out.
	watched := s.locker(t, targetOf(srv), &fencelock.Options{TTL: 30 * time.Second, RenewInterval: 100 * time.Millisecond})
	var (
		cause   error
		elapsed time.Duration
	)
	err = watched.RunWithLock(ctx, name+".lost", func(wctx context.Context, lease *fencelock.Lease) error {
		_, err := srv.Do("DEL", lease.Key())
		assert.NoError(t, err)
		deleted := time.Now()
		select {
		case <-wctx.Done():
			elapsed, cause = time.Since(deleted), context.Cause(wctx)
		case <-time.After(within):
			t.Errorf("the work's ctx not cancelled within %v of the lock's deletion", within)
		}
		return nil
	})
	t.Logf("the work's ctx ended %v after the deletion: %v", elapsed.Round(time.Millisecond), cause)
	assert.ErrorIs(t, cause, fencelock.ErrLost, "the work's ctx's cause")
	assert.ErrorIs(t, err, fencelock.ErrLost, "RunWithLock reports the loss")
}

// crossClient: the suite's go-redis Locker and the client's take the same
// locks: each excludes the other, fences increase across both, and a
// release by either wakes a waiter of the other.
func (s *suite) crossClient(t *testing.T) {
	srv := redistest.Start(t)
	ours := s.locker(t, targetOf(srv), patient())
	ref := reference(t, targetOf(srv), patient())
	ctx := callCtx(t)
	name := nameOf(t, "")

	var last int64
	for i, pair := range [][2]*fencelock.Locker{{ref, ours}, {ours, ref}, {ref, ours}, {ours, ref}} {
		holder, other := pair[0], pair[1]
		lease, err := holder.Acquire(ctx, name)
		require.NoError(t, err, "round %d", i)
		assert.Greater(t, lease.Fence(), last, "round %d: fences increase across clients", i)
		last = lease.Fence()
		_, err = other.Acquire(ctx, name)
		requireBusy(t, err, "round %d: the other client's Acquire of a held lock", i)
		release(t, lease)
	}

	// Wake-ups across clients: a waiter whose pause between attempts is as
	// long as the holder's TTL obtains the lock soon after the release only
	// if the release's publication woke it.
	for _, tc := range []struct {
		what           string
		holder, waiter *fencelock.Locker
	}{
		{"go-redis releases, " + s.c.Name + " waits", ref, ours},
		{s.c.Name + " releases, go-redis waits", ours, ref},
	} {
		held, err := tc.holder.Acquire(ctx, name, fencelock.WithTTL(holdTTL))
		require.NoError(t, err, tc.what)
		assert.Greater(t, held.Fence(), last)
		got := acquireInBackground(t, tc.waiter, name, fencelock.WithWait(2*holdTTL))
		requireSubscribed(t, srv, held.Key())
		requireNotYet(t, got, tc.what+": the waiter")
		released := time.Now()
		release(t, held)
		r := requireAcquired(t, got, within, tc.what+": woken by the release")
		t.Logf("%s: obtained %v after the release", tc.what, r.at.Sub(released).Round(time.Millisecond))
		assert.Greater(t, r.lease.Fence(), held.Fence(), tc.what)
		last = r.lease.Fence()
		release(t, r.lease)
	}
}

// fair: waiters with WithFair obtain the lock in the order they arrived.
func (s *suite) fair(t *testing.T) {
	srv := redistest.Start(t)
	target := targetOf(srv)
	holderL, first, second := s.locker(t, target, nil), s.locker(t, target, nil), s.locker(t, target, nil)
	ctx := callCtx(t)
	name := nameOf(t, "")
	queue := lockKey(name) + ":q"
	queued := func(n int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			v, err := srv.Do("ZCARD", queue)
			return err == nil && v == n
		}, within, 5*time.Millisecond, "%d waiters in line", n)
	}

	held, err := holderL.Acquire(ctx, name, fencelock.WithTTL(holdTTL))
	require.NoError(t, err)
	fairly := []fencelock.Option{fencelock.WithFair(), fencelock.WithWait(2 * holdTTL), fencelock.WithTTL(holdTTL)}
	got1 := acquireInBackground(t, first, name, fairly...)
	queued(1)
	got2 := acquireInBackground(t, second, name, fairly...)
	queued(2)

	release(t, held)
	a := requireAcquired(t, got1, within, "the first in line obtains the lock first")
	assert.Greater(t, a.lease.Fence(), held.Fence())
	requireNotYet(t, got2, "the second in line, while the first holds the lock")
	release(t, a.lease)
	b := requireAcquired(t, got2, within, "the second in line obtains the lock next")
	assert.Greater(t, b.lease.Fence(), a.lease.Fence())
	release(t, b.lease)
	require.Eventually(t, func() bool { return !keyExists(t, srv, queue) }, within, 10*time.Millisecond, "the line is gone")
}

// semaphore: at most its permits hold a semaphore, with either client.
func (s *suite) semaphore(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	ref := reference(t, targetOf(srv), nil)
	ctx := callCtx(t)
	name := nameOf(t, "")
	sem := l.Semaphore(name, 2)

	a, err := sem.Acquire(ctx)
	require.NoError(t, err, "permit 1 of 2")
	b, err := ref.Semaphore(name, 2).Acquire(ctx)
	require.NoError(t, err, "permit 2 of 2, by go-redis")
	assert.Greater(t, b.Fence(), a.Fence())
	_, err = sem.Acquire(ctx)
	requireBusy(t, err, "a third permit")
	_, err = ref.Semaphore(name, 2).Acquire(ctx)
	requireBusy(t, err, "a third permit, by go-redis")

	info, err := sem.Inspect(ctx)
	require.NoError(t, err, "Semaphore.Inspect")
	assert.Equal(t, 2, info.Permits)
	assert.Len(t, info.Holders, 2)

	got := inBackground(t, func(ctx context.Context) (*fencelock.Lease, error) {
		return sem.Acquire(ctx, fencelock.WithWait(2*holdTTL))
	})
	release(t, b)
	c := requireAcquired(t, got, within, "a waiter obtains the permit released")
	assert.Greater(t, c.lease.Fence(), b.Fence())
	_, err = sem.Acquire(ctx)
	requireBusy(t, err, "again a third permit")
	release(t, a)
	release(t, c.lease)

	ran := 0
	require.NoError(t, sem.RunWithLock(ctx, func(context.Context, *fencelock.Lease) error { ran++; return nil }))
	assert.Equal(t, 1, ran)
	info, err = sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Empty(t, info.Holders, "all permits released")
}

// rwlock: shares together, or one exclusive holder, never both.
func (s *suite) rwlock(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	ref := reference(t, targetOf(srv), nil)
	ctx := callCtx(t)
	name := nameOf(t, "")
	rw := l.RWLock(name)

	r1, err := rw.AcquireShared(ctx)
	require.NoError(t, err, "share 1")
	r2, err := ref.RWLock(name).AcquireShared(ctx)
	require.NoError(t, err, "share 2, by go-redis")
	assert.Greater(t, r2.Fence(), r1.Fence())
	_, err = rw.Acquire(ctx)
	requireBusy(t, err, "exclusive while shared")
	_, err = ref.RWLock(name).Acquire(ctx)
	requireBusy(t, err, "exclusive while shared, by go-redis")
	info, err := rw.Inspect(ctx)
	require.NoError(t, err, "RWLock.Inspect")
	assert.Nil(t, info.Writer)
	assert.Len(t, info.Readers, 2)
	release(t, r1)
	release(t, r2)

	w, err := rw.Acquire(ctx, fencelock.WithWait(within))
	require.NoError(t, err, "exclusive once the shares are released")
	assert.Greater(t, w.Fence(), r2.Fence())
	_, err = rw.AcquireShared(ctx)
	requireBusy(t, err, "shared while exclusive")
	_, err = ref.RWLock(name).AcquireShared(ctx)
	requireBusy(t, err, "shared while exclusive, by go-redis")
	_, err = rw.Acquire(ctx)
	requireBusy(t, err, "exclusive while exclusive")
	info, err = rw.Inspect(ctx)
	require.NoError(t, err)
	if assert.NotNil(t, info.Writer) {
		assert.Equal(t, w.Fence(), info.Writer.Fence)
	}
	release(t, w)

	r3, err := rw.AcquireShared(ctx, fencelock.WithWait(within))
	require.NoError(t, err, "shared again")
	release(t, r3)
}

// acquireAll: several names all or none, and RunWithLocks.
func (s *suite) acquireAll(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	ref := reference(t, targetOf(srv), nil)
	ctx := callCtx(t)
	var names []string
	for i := range 4 {
		names = append(names, nameOf(t, fmt.Sprintf(".%d", i)))
	}

	leases, err := l.AcquireAll(ctx, names[:3])
	require.NoError(t, err)
	require.Len(t, leases, 3)
	for i, lease := range leases {
		assert.Equal(t, names[i], lease.Name(), "in the order given")
		assert.Positive(t, lease.Fence())
		_, err := ref.Acquire(ctx, names[i])
		requireBusy(t, err, "%s held by AcquireAll", names[i])
	}
	_, err = l.AcquireAll(ctx, []string{names[3], names[2]})
	requireBusy(t, err, "AcquireAll with one name held")
	assert.False(t, keyExists(t, srv, lockKey(names[3])), "all or none: the free name is not left held")
	_, err = ref.AcquireAll(ctx, []string{names[3], names[0]})
	requireBusy(t, err, "go-redis AcquireAll with one name held")
	for _, lease := range leases {
		release(t, lease)
	}

	ran := false
	require.NoError(t, l.RunWithLocks(ctx, names, func(ctx context.Context, leases []*fencelock.Lease) error {
		ran = true
		assert.Len(t, leases, len(names))
		for _, name := range names {
			assert.True(t, keyExists(t, srv, lockKey(name)), "%s held while the work runs", name)
		}
		_, err := ref.Acquire(ctx, names[1])
		requireBusy(t, err, "held by RunWithLocks")
		return nil
	}))
	assert.True(t, ran)
	for _, name := range names {
		assert.False(t, keyExists(t, srv, lockKey(name)), "%s released after the work", name)
	}
}

// inspectAndCheck: Inspect shows the holder, its fence and TTL, by either
// client; Check finds nothing critical on a healthy server.
func (s *suite) inspectAndCheck(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	ref := reference(t, targetOf(srv), nil)
	ctx := callCtx(t)
	name := nameOf(t, "")

	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held, "not held yet")

	lease, err := l.Acquire(ctx, name, fencelock.WithOwner("inspected"), fencelock.WithTTL(time.Minute))
	require.NoError(t, err)
	for _, by := range []*fencelock.Locker{l, ref} {
		info, err := by.Inspect(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, name, info.Name)
		assert.True(t, info.Held)
		assert.Equal(t, "inspected", info.Owner)
		assert.Equal(t, lease.Fence(), info.Fence)
		assert.Equal(t, lease.Fence(), info.LastFence)
		assert.Positive(t, info.TTL)
		assert.LessOrEqual(t, info.TTL, time.Minute)
	}
	release(t, lease)

	fs, err := l.Check(ctx)
	require.NoError(t, err, "Check")
	for _, f := range fs {
		t.Log(f)
		assert.NotEqual(t, fencelock.SeverityCritical, f.Severity, "Check on a healthy server: %s", f)
	}
}
