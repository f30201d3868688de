package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// inspect and watch on the name of a semaphore or a read-write lock.

// TestInspectSemaphoreFirst: inspect on the name of a semaphore leads with
// what the name is, the semaphore, its permits held and its holders; the
// lock of the same name, not held, follows (issue 34).
func TestInspectSemaphoreFirst(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newLocker(t, srv.Client(nil), "pod-a", nil)
	var held []*fencelock.Lease
	for range 3 {
		l, err := a.Semaphore("reports", 3).Acquire(ctx, fencelock.WithTTL(2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	r := fl(t, "inspect", "--url", urlOf(srv), "reports").want(t, exitOK).
		wantOut(t, "permits     3 held of 3\n", "holder      pod-a, fence ", "token "+held[2].Token(), "held        no\n")
	lines := strings.Split(r.stdout, "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "name ") || !strings.HasPrefix(lines[1], "semaphore ") ||
		!strings.HasPrefix(lines[2], "permits ") {
		t.Fatalf("inspect of a semaphore starts with\n%s\nwant its name, then the semaphore and its permits", strings.Join(lines[:min(3, len(lines))], "\n"))
	}
	if h, lock := strings.LastIndex(r.stdout, "holder "), strings.Index(r.stdout, "held        no"); lock < h {
		t.Fatalf("inspect shows the lock not held before the semaphore's holders:\n%s", r.stdout)
	}
}

// TestWatchSemaphore: watch on the name of a semaphore follows its
// permits: those held when it starts (not "free"), then each taken,
// freed, expired, and freed by release --force --permit, with the permits
// held after each (issue 34).
func TestWatchSemaphore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := urlOf(srv)
	a := newLocker(t, srv.Client(nil), "pod-a", nil)
	b := newLocker(t, srv.Client(nil), "pod-b", nil)
	var held []*fencelock.Lease
	for range 3 {
		l, err := a.Semaphore("api", 3).Acquire(ctx, fencelock.WithTTL(2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	w := startWatch(t, "--url", u, "--interval", "20ms", "api")
	for _, l := range held {
		ev := w.expectPermit(t, evHolding, l.Fence(), 3, 3)
		if ev["owner"] != "pod-a" || ev["token"] != l.Token() || jsonInt(ev["ttl_ms"]) <= 60000 {
			t.Fatalf("holding event %v, want pod-a's permit with token %s and its TTL", ev, l.Token())
		}
	}

	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := w.expectPermit(t, evFreed, held[0].Fence(), 2, 3); ev["forced"] != nil {
		t.Fatalf("freed event %v, want not forced", ev)
	}

	// Taken, never renewed: it expires. Its TTL leaves the watch, reading
	// every 20ms, time to see it taken on a busy machine.
	const ttl = 5 * time.Second
	short, err := b.Semaphore("api", 3).Acquire(ctx, fencelock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.expectPermit(t, evTaken, short.Fence(), 3, 3); ev["owner"] != "pod-b" || jsonInt(ev["ttl_ms"]) <= 0 {
		t.Fatalf("taken event %v, want pod-b's permit and a TTL", ev)
	}
	if ev := w.expectPermit(t, evExpired, short.Fence(), 2, 3); ev["owner"] != "pod-b" {
		t.Fatalf("expired event %v, want pod-b's permit", ev)
	}

	fl(t, "release", "--url", u, "--force", "--yes", "--permit", held[1].Token(), "api").want(t, exitOK)
	if ev := w.expectPermit(t, evFreed, held[1].Fence(), 1, 3); ev["forced"] != true {
		t.Fatalf("freed event %v, want forced", ev)
	}
	if err := held[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	w.expectPermit(t, evFreed, held[2].Fence(), 0, 3)
}

// expectPermit checks that the next event is kind, of a semaphore's permit
// with fence, with held of permits held after it.
func (w *watcher) expectPermit(t *testing.T, kind string, fence int64, held, permits int) map[string]any {
	t.Helper()
	ev := w.expect(t, kind, fence)
	if ev["kind"] != "semaphore" || jsonInt(ev["permits_held"]) != int64(held) || jsonInt(ev["permits"]) != int64(permits) {
		t.Fatalf("event %v, want a semaphore's with %d of %d permits held", ev, held, permits)
	}
	return ev
}

// TestWatchRWLock: watch on the name of a read-write lock follows its
// holders, shared and exclusive, as it follows a semaphore's permits
// (issue 34).
func TestWatchRWLock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newLocker(t, srv.Client(nil), "pod-a", nil)
	b := newLocker(t, srv.Client(nil), "pod-b", nil)
	r1, err := a.RWLock("catalogue").AcquireShared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, "--url", urlOf(srv), "--interval", "20ms", "catalogue")
	w.expectRW(t, evHolding, r1.Fence(), "shared")
	r2, err := b.RWLock("catalogue").AcquireShared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.expectRW(t, evTaken, r2.Fence(), "shared"); ev["owner"] != "pod-b" {
		t.Fatalf("taken event %v, want pod-b's", ev)
	}
	for _, r := range []*fencelock.Lease{r1, r2} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w.expectRW(t, evFreed, r.Fence(), "shared")
	}
	// Never renewed: it expires.
	wr, err := a.RWLock("catalogue").Acquire(ctx, fencelock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w.expectRW(t, evTaken, wr.Fence(), "exclusive")
	w.expectRW(t, evExpired, wr.Fence(), "exclusive")
}

// expectRW checks that the next event is kind, of a read-write lock's
// holder with fence in mode.
func (w *watcher) expectRW(t *testing.T, kind string, fence int64, mode string) map[string]any {
	t.Helper()
	ev := w.expect(t, kind, fence)
	if ev["kind"] != "rwlock" || ev["mode"] != mode {
		t.Fatalf("event %v, want a read-write lock's, %s", ev, mode)
	}
	return ev
}
