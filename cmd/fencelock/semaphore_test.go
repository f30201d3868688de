package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestSemaphores: ls and inspect show a semaphore's holders beside the
// lock of the same name, and release --force --permit frees one holder's
// permit, whose holder then finds it gone and whose waiter gets it.
func TestSemaphores(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := urlOf(srv)
	client := srv.Client(nil)
	a := newLocker(t, client, "pod-a (pid 1)", nil)
	b := newLocker(t, client, "pod-b (pid 2)", nil)
	// heldTTL, newLocker's: the permits must outlive the test's CLI runs,
	// which took 25s once in CI (a 20s permit expired before release
	// --force freed it).
	x, err := a.Semaphore("api", 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.Semaphore("api", 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lock := acquire(t, a, "job")

	r := fl(t, "ls", "--url", u).want(t, exitOK)
	checkTSV(t, r.stdout, fmt.Sprintf("job\tpod-a (pid 1)\t*\t%d\t0\napi\tpod-a (pid 1)\t*\t%d\t0\tsemaphore 2/2\napi\tpod-b (pid 2)\t*\t%d\t0\tsemaphore 2/2\n",
		lock.Fence(), x.Fence(), y.Fence()))
	var doc struct {
		Locks      []lockJSON
		Semaphores []semJSON
	}
	fl(t, "ls", "--json", "--url", u, "a*").want(t, exitOK).jsonOut(t, &doc)
	if len(doc.Locks) != 0 || len(doc.Semaphores) != 1 {
		t.Fatalf("ls --json a*: %+v, want the semaphore api only", doc)
	}
	s := doc.Semaphores[0]
	if s.Name != "api" || s.Key != "lock:{api}:sem" || s.Permits != 2 || len(s.Holders) != 2 ||
		s.Holders[0].Token != x.Token() || s.Holders[1].Owner != "pod-b (pid 2)" || s.Holders[1].Fence != y.Fence() ||
		s.Holders[0].TTLMillis <= 10000 || s.LastFence != y.Fence() {
		t.Fatalf("ls --json: %+v, want api's two holders", s)
	}

	// inspect: the lock of the name is not held, the semaphore is.
	fl(t, "inspect", "--url", u, "api").want(t, exitOK).wantOut(t, "held        no", "semaphore   lock:{api}:sem",
		"permits     2 held of 2", "pod-b (pid 2), fence", "token "+y.Token())
	var one struct {
		lockJSON
		Semaphore *semJSON
	}
	fl(t, "inspect", "--json", "--url", u, "job").want(t, exitOK).jsonOut(t, &one)
	if !one.Held || one.Semaphore != nil {
		t.Fatalf("inspect --json job: %+v, want the lock without a semaphore", one)
	}
	fl(t, "inspect", "--url", u, "nothing").want(t, exitFailed)

	// release --force --permit: a dry run, an unknown token, then for real.
	w := make(chan error, 1)
	go func() {
		got, err := b.Semaphore("api", 2).Acquire(ctx, fencelock.WithWait(heldTTL))
		if err == nil {
			err = got.Release(ctx)
		}
		w <- err
	}()
	eventually(t, patience, "the waiter subscribed", func() bool {
		info, err := b.Semaphore("api", 2).Inspect(ctx)
		return err == nil && info.Waiters == 1
	})
	fl(t, "release", "--url", u, "--force", "--permit", x.Token()[:8], "api").want(t, exitFailed).
		wantOut(t, `would free the permit of semaphore "api" held by pod-a (pid 1), fence`)
	fl(t, "release", "--url", u, "--force", "--permit", "00000000", "api").want(t, exitFailed).wantErr(t, "no holder with token 00000000")
	fl(t, "release", "--url", u, "--force", "--permit", "abc", "api").want(t, exitUsage).wantErr(t, "8 characters")
	fl(t, "release", "--url", u, "--force", "--yes", "--permit", x.Token(), "api").want(t, exitOK).
		wantOut(t, `freed the permit of semaphore "api" held by pod-a (pid 1)`)
	select {
	case err := <-w:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("the waiter did not get the permit the forced release freed")
	}
	if err := x.Extend(ctx, time.Minute); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Fatalf("the freed holder's Extend: %v, want ErrNotHeld", err)
	}
	if _, err := a.Semaphore("api", 2).Acquire(ctx); err != nil {
		t.Fatalf("a permit is free: %v", err)
	}
	if n, _ := client.Exists(ctx, "lock:{api}:sem:t:"+x.Token()).Result(); n != 1 {
		t.Fatal("the freed holder's token is not retired")
	}
	r = fl(t, "release", "--url", u, "--force", "--yes", "--permit", x.Token(), "api").want(t, exitFailed)
	if !strings.Contains(r.stderr, "no holder with token") {
		t.Fatalf("freeing it again: %q", r.stderr)
	}
}
