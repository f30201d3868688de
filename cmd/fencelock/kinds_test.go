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
