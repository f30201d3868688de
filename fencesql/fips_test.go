package fencesql_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/fipstest"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestFIPS140Only runs a program using fencesql with fencelock's leases
// and SQLite (testdata/fips) with GODEBUG=fips140=only, where computing a
// SHA-1 panics: a fenced write, a stale one refused, an idempotency key
// recorded once. Before the library's script hashes were constants, the
// program panicked at start-up.
func TestFIPS140Only(t *testing.T) {
	t.Parallel()
	bin := fipstest.Build(t, "./testdata/fips")
	srv := redistest.Start(t)
	out := fipstest.Run(t, bin, "-addr", srv.Addr, "-db", filepath.Join(t.TempDir(), "fips.db"), "-name", t.Name())
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("the program printed %q, want \"ok\"", out)
	}
}
