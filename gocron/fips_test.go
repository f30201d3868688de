package fencegocron_test

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/fipstest"
)

// TestFIPS140Only runs a program scheduling a job with the Locker
// (testdata/fips) with GODEBUG=fips140=only, where computing a SHA-1
// panics. Before the library's script hashes were constants, the program
// panicked at start-up.
func TestFIPS140Only(t *testing.T) {
	t.Parallel()
	bin := fipstest.Build(t, "./testdata/fips")
	addr := startRedis(t)
	out := fipstest.Run(t, bin, "-addr", addr, "-name", t.Name())
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("the program printed %q, want \"ok\"", out)
	}
}
