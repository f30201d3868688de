package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// ls and inspect show read-write locks: each holder, shared or exclusive,
// and the writers waiting.
func TestRWLocks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := urlOf(srv)
	a := newLocker(t, srv.Client(nil), "pod-a", nil)
	b := newLocker(t, srv.Client(nil), "pod-b", nil)

	catalogue := a.RWLock("catalogue")
	r1, err := catalogue.AcquireShared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.RWLock("catalogue").AcquireShared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = b.RWLock("catalogue").Acquire(wctx, fencelock.WithWait(heldTTL)) }()
	eventually(t, patience, "the writer waits", func() bool {
		info, err := catalogue.Inspect(ctx)
		return err == nil && info.WritersWaiting == 1
	})
	w, err := a.RWLock("index").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plain := acquire(t, a, "job")

	r := fl(t, "ls", "--url", u).want(t, exitOK)
	checkTSV(t, r.stdout, fmt.Sprintf("job\tpod-a\t*\t%d\t0\ncatalogue\tpod-a\t*\t%d\t1\tshared\ncatalogue\tpod-b\t*\t%d\t1\tshared\nindex\tpod-a\t*\t%d\t0\texclusive\n",
		plain.Fence(), r1.Fence(), r2.Fence(), w.Fence()))

	var doc struct {
		Locks   []lockJSON
		RWLocks []rwlockJSON
	}
	fl(t, "ls", "--json", "--url", u).want(t, exitOK).jsonOut(t, &doc)
	if len(doc.Locks) != 1 || len(doc.RWLocks) != 2 {
		t.Fatalf("ls --json = %+v, want 1 lock and 2 read-write locks", doc)
	}
	if got := doc.RWLocks[0]; got.Name != "catalogue" || got.Key != "lock:{catalogue}:rw" || got.Writer != nil ||
		len(got.Readers) != 2 || got.Readers[0].Fence != r1.Fence() || got.WritersWaiting != 1 || got.LastFence != r2.Fence() {
		t.Fatalf("ls --json: %+v", got)
	}
	if got := doc.RWLocks[1]; got.Name != "index" || got.Writer == nil || got.Writer.Owner != "pod-a" ||
		got.Writer.Fence != w.Fence() || got.Writer.TTLMillis <= 0 || len(got.Readers) != 0 {
		t.Fatalf("ls --json: %+v", got)
	}

	// The plain lock of the name is not held, the read-write lock is.
	fl(t, "inspect", "--url", u, "catalogue").want(t, exitOK).wantOut(t,
		"held        no\n",
		"rwlock           lock:{catalogue}:rw\n",
		"reader           pod-a, ttl ",
		fmt.Sprintf(", fence %d\n", r2.Fence()),
		"writers waiting  1\n")
	var got inspectJSON
	fl(t, "inspect", "--url", u, "--json", "index").want(t, exitOK).jsonOut(t, &got)
	if got.Held || got.RWLock == nil || got.RWLock.Writer == nil || got.RWLock.Writer.Fence != w.Fence() {
		t.Fatalf("inspect --json index = %+v", got)
	}
	var job inspectJSON
	fl(t, "inspect", "--url", u, "--json", "job").want(t, exitOK).jsonOut(t, &job)
	if !job.Held || job.RWLock != nil {
		t.Fatalf("inspect --json job = %+v, want no rwlock", job)
	}
	for _, lease := range []*fencelock.Lease{r1, r2, w} {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLsTerminalRWLocksOnly: on a terminal, ls with read-write locks only
// lists them, without saying that no lock is held.
func TestLsTerminalRWLocksOnly(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := newLocker(t, srv.Client(nil), "pod-r", nil)
	share, err := l.RWLock("catalogue").AcquireShared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer share.Release(ctx)
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, tty: true, getenv: func(string) string { return "" }}
	if code := run(ctx, []string{"ls", "--url", urlOf(srv)}, e); code != exitOK {
		t.Fatalf("ls: exit %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, "no lock held") || !strings.Contains(out, "RWLOCK") || !strings.Contains(out, "catalogue") {
		t.Errorf("ls on a terminal with a read-write lock only:\n%s", out)
	}
}
