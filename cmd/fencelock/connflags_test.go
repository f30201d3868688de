package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestConnectionFlagsBeforeCommand: the connection flags go before the
// command too, as redis-cli and kubectl users type them; given on both
// sides, the one after the command wins. Other flags before the command
// are refused with a line that says where they go (issue 34).
func TestConnectionFlagsBeforeCommand(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	u := urlOf(srv)
	client := srv.Client(&redis.Options{DB: 2})
	a := newLocker(t, client, "pod-a", &fencelock.Options{KeyPrefix: "jobs:"})
	// Ten minutes: the lock outlives the test's CLI runs, which took 4s
	// each on a busy machine (30s, the default, ran out before ls).
	lease := acquire(t, a, "nightly", fencelock.WithTTL(10*time.Minute))
	fence := fmt.Sprintf("fence       %d\n", lease.Fence())

	fl(t, "--url", u, "--db", "2", "--prefix", "jobs:", "inspect", "nightly").want(t, exitOK).wantOut(t, fence)
	fl(t, "--url="+u+"/2", "-prefix", "jobs:", "--timeout", "5s", "inspect", "--json", "nightly").want(t, exitOK).wantOut(t, `"held": true`)
	fl(t, "--url", u, "inspect", "--db", "2", "--prefix", "jobs:", "nightly").want(t, exitOK).wantOut(t, fence)
	// Before and after: the later wins.
	fl(t, "--url", "redis://127.0.0.1:1", "--prefix", "other:", "inspect", "--url", u+"/2", "--prefix", "jobs:", "nightly").
		want(t, exitOK).wantOut(t, fence)
	fl(t, "--url", u+"/2", "--prefix", "jobs:", "inspect", "--prefix", "other:", "nightly").want(t, exitFailed)
	fl(t, "--url", u+"/2", "--prefix", "jobs:", "ls").want(t, exitOK).wantOut(t, "nightly\tpod-a\t")
	fl(t, "--url", u+"/2", "--prefix", "jobs:", "watch", "--for", "300ms", "nightly").want(t, exitOK).wantOut(t, " held fence=")
	fl(t, "--url", u, "help", "inspect").want(t, exitOK).wantOut(t, "Usage: fencelock inspect")

	fl(t, "--nope", "inspect", "nightly").want(t, exitUsage).wantErr(t, "-nope", "before the command")
	fl(t, "--json", "ls").want(t, exitUsage).wantErr(t, "-json", "after the command")
	fl(t, "--url", u).want(t, exitUsage).wantErr(t, "missing the command")
	fl(t, "--db", "x", "ls").want(t, exitUsage).wantErr(t, "invalid value")
}
