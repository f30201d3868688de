package main

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestFIPS140Only runs the command with GODEBUG=fips140=only, where
// computing a SHA-1 panics: ls, inspect, doctor, and release --force of a
// lock and of a semaphore's permit. Before, every command panicked at
// start-up (redis.NewScript hashes its script in the command's package
// variables).
func TestFIPS140Only(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := urlOf(srv)
	l := newLocker(t, srv.Client(nil), "fips-pod", nil)
	// Two minutes: the leases must outlive the command's runs on a busy
	// machine.
	lease := acquire(t, l, "job", fencelock.WithTTL(2*time.Minute))
	permit, err := l.Semaphore("api", 2).Acquire(ctx, fencelock.WithTTL(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	fips := []string{"GODEBUG=fips140=only"}

	flEnv(t, fips, "ls", "--url", u).want(t, exitOK).wantOut(t, "job\tfips-pod\t")
	flEnv(t, fips, "inspect", "--url", u, "job").want(t, exitOK).wantOut(t, "fips-pod")
	if r := flEnv(t, fips, "doctor", "--url", u); r.code != exitOK && r.code != exitFailed {
		t.Fatalf("doctor: exit code %d, want a verdict (%d or %d); stderr:\n%s", r.code, exitOK, exitFailed, r.stderr)
	}
	flEnv(t, fips, "release", "--url", u, "--force", "--yes", "job").want(t, exitOK)
	if err := lease.Extend(ctx, time.Minute); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Fatalf("Extend after release --force: %v, want ErrNotHeld", err)
	}
	flEnv(t, fips, "release", "--url", u, "--force", "--yes", "--permit", permit.Token(), "api").want(t, exitOK)
	if err := permit.Extend(ctx, time.Minute); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Fatalf("the permit's Extend after release --force --permit: %v, want ErrNotHeld", err)
	}
}
