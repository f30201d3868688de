package chaos

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "worker" {
		os.Exit(workerMain())
	}
	goleak.VerifyTestMain(m,
		// go-redis probes a server it could not dial once a second until the
		// pool is closed and the probe wakes up to see it.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// table collects each scenario's row for the summary TestChaos prints last.
var table struct {
	mu   sync.Mutex
	rows []string // guarded by mu
}

// report logs a scenario's row, with the details that explain it, and keeps
// the row for the summary.
func report(t *testing.T, name string, f figures, notes ...string) {
	t.Helper()
	row := f.row(name)
	table.mu.Lock()
	table.rows = append(table.rows, row)
	table.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n%s\n%s\n", tableHeader, tableRule, row)
	for _, n := range notes {
		b.WriteString("  " + n + "\n")
	}
	b.WriteString(describeDoubles(f))
	b.WriteString(describeLosses(f))
	if f.Visualization != "" {
		fmt.Fprintf(&b, "  porcupine visualization: %s\n", f.Visualization)
	}
	t.Log(b.String())
}

// TestChaos runs the scenarios in order, each in a subtest with its own Redis
// processes, proxies and workers, and prints the table of their figures.
func TestChaos(t *testing.T) {
	start := time.Now()
	t.Run("S0_no_fault", func(t *testing.T) { testS0(t, plain) })
	t.Run("S0_no_fault_fair", func(t *testing.T) { testS0(t, fair) })
	t.Run("S1_holder_paused", func(t *testing.T) { testS1(t, plain) })
	t.Run("S1_holder_paused_fair", func(t *testing.T) { testS1(t, fair) })
	t.Run("S2_partition_and_latency", func(t *testing.T) { testS2(t, plain) })
	t.Run("S2_partition_and_latency_fair", func(t *testing.T) { testS2(t, fair) })
	t.Run("S3_failover_unreplicated", func(t *testing.T) { testS3(t, plain) })
	t.Run("S3_failover_unreplicated_fair", func(t *testing.T) { testS3(t, fair) })
	t.Run("S3r_failover_with_replicas_1", testS3Replicas)
	t.Run("S4_sentinel", func(t *testing.T) { testS4(t, plain) })
	t.Run("S5_restart", testS5)
	t.Run("S6_slow_clock_inside", func(t *testing.T) { testS6(t, true) })
	t.Run("S6_slow_clock_beyond", func(t *testing.T) { testS6(t, false) })
	t.Run("S6_slow_clock_renewals", testS6Renewals)
	t.Run("N1_semaphore", testN1)
	t.Run("R0_redlock_no_fault", testR0)
	t.Run("R1_redlock_minority_killed", testR1)
	t.Run("R2_redlock_minority_paused", testR2)
	t.Run("R3_redlock_holder_paused", testR3)
	t.Run("R4_redlock_restart_double_grant", testR4)
	// The paused holder and the failovers on the other clients, through
	// their adapters (fencerueidis, fencevalkey).
	for _, v := range []variant{onRueid, onValkey} {
		suffix := "_" + strings.TrimSuffix(v.client, "-go")
		t.Run("S1_holder_paused"+suffix, func(t *testing.T) { testS1(t, v) })
		t.Run("S3_failover_unreplicated"+suffix, func(t *testing.T) { testS3(t, v) })
		t.Run("S4_sentinel"+suffix, func(t *testing.T) { testS4(t, v) })
	}

	table.mu.Lock()
	defer table.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n%s\n", tableHeader, tableRule)
	for _, r := range table.rows {
		b.WriteString(r + "\n")
	}
	fmt.Fprintf(&b, "(%d scenarios in %.1fs)\n", len(table.rows), time.Since(start).Seconds())
	fmt.Print("\nfencelock chaos summary\n" + b.String())
	if path := os.Getenv("FENCELOCK_CHAOS_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("writing the table: %v", err)
		}
	}
}
