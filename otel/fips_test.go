package fencelockotel_test

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/fipstest"
	"github.com/fencelock/fencelock/internal/redistest"
)

// TestFIPS140Only runs a program using the Observer with the OpenTelemetry
// SDK (testdata/fips) with GODEBUG=fips140=only, where computing a SHA-1
// panics: its spans and metrics of an Acquire, a Release and a RunWithLock.
// Before the library's script hashes were constants, the program panicked
// at start-up.
func TestFIPS140Only(t *testing.T) {
	t.Parallel()
	bin := fipstest.Build(t, "./testdata/fips")
	srv := redistest.Start(t)
	out := fipstest.Run(t, bin, "-addr", srv.Addr, "-name", t.Name())
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("the program printed %q, want \"ok\"", out)
	}
}
