package fencelock_test

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/fipstest"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestFIPS140Only runs a program using the library (testdata/fips) with
// GODEBUG=fips140=only, where computing a SHA-1 panics: a lock, a renewal,
// a waiting Acquire woken by a release, a semaphore's permits, a read-write
// lock, two names at once, Inspect, Check, and a Redlock over three servers.
// Before the scripts' hashes were constants, the program panicked at
// start-up.
func TestFIPS140Only(t *testing.T) {
	t.Parallel()
	bin := fipstest.Build(t, "./testdata/fips")
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = redistest.Start(t).Addr
	}
	out := fipstest.Run(t, bin, "-addrs", strings.Join(addrs, ","), "-prefix", t.Name())
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("the program printed %q, want \"ok\"", out)
	}
}
