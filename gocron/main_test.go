package fencegocron_test

import (
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The multi-process tests re-execute this test binary as the
	// schedulers; dispatch that role before any test runs.
	if raw := os.Getenv(envScheduler); raw != "" {
		os.Exit(schedulerMain(raw))
	}
	// Under -race every process sleeps 1s at exit by default (the race
	// detector's atexit_sleep_ms); the schedulers inherit this and exit at
	// once.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	goleak.VerifyTestMain(m)
}
