package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/examples/internal/demotest"
)

// commandEnv makes the test binary run as the transfer command itself.
const commandEnv = "FENCELOCK_TRANSFER_COMMAND"

func TestMain(m *testing.M) {
	// The story re-executes its own binary as the workers; under test that
	// is this test binary, so the roles are dispatched before any test runs.
	if code, isWorker := workerMain(); isWorker {
		os.Exit(code)
	}
	if os.Getenv(commandEnv) == "1" {
		os.Exit(runMain())
	}
	// Under -race every process sleeps 1s at exit by default; the workers
	// inherit this and exit at once.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	goleak.VerifyTestMain(m)
}

// TestStory runs the story against each combination of embedded and real
// servers and checks what happened: every transfer moved its money once.
func TestStory(t *testing.T) {
	tests := []struct {
		name            string
		redis, database func(t testing.TB) string
	}{
		{name: "embedded"},
		{name: "real redis", redis: demotest.RealRedis},
		{name: "postgres", database: demotest.RealPostgres},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Out: demotest.Output(t)}
			cfg.Stderr = cfg.Out
			if tt.redis != nil {
				cfg.RedisAddr = tt.redis(t)
			}
			if tt.database != nil {
				cfg.DatabaseURL = tt.database(t)
			}
			res, err := run(t.Context(), cfg)
			require.NoError(t, err)
			checkStory(t, res)
			if cfg.RedisAddr != "" {
				checkKeysGone(t, cfg.RedisAddr, res.Keys)
			}
		})
	}
}

// checkStory checks the outcomes, the ledger and the balances.
func checkStory(t *testing.T, res Result) {
	t.Helper()
	require.Len(t, res.Outcomes, 8)
	for _, o := range res.Outcomes {
		assert.Equal(t, Moved, o.Outcome, "%s: %s", o.ID, o.Err)
		assert.Positive(t, o.FromFence, o.ID)
		assert.Positive(t, o.ToFence, o.ID)
	}
	require.Len(t, res.Ledger, 8, "every transfer in the ledger, once")
	// Every transfer can pay whatever the order, so the end is known.
	want := []Account{{ID: "alice", Balance: 100_00}, {ID: "bob", Balance: 85_00}, {ID: "carol", Balance: 135_00}, {ID: "dave", Balance: 80_00}}
	require.Len(t, res.Accounts, len(want))
	last := map[string]int64{}
	for _, e := range res.Ledger {
		last[e.From] = max(last[e.From], e.FromFence)
		last[e.To] = max(last[e.To], e.ToFence)
	}
	for i, a := range res.Accounts {
		assert.Equal(t, want[i].ID, a.ID)
		assert.Equal(t, dollars(want[i].Balance), dollars(a.Balance), a.ID)
		assert.Equal(t, last[a.ID], a.Fence, "%s's row carries the fence of its last transfer", a.ID)
	}
	require.NoError(t, check(res))
}

func checkKeysGone(t *testing.T, addr string, keys []string) {
	t.Helper()
	require.NotEmpty(t, keys)
	c, err := demo.NewRedisClient(t.Context(), addr)
	require.NoError(t, err)
	defer c.Close()
	n, err := c.Exists(t.Context(), keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "keys left behind of %v", keys)
}

// check must catch a lost transfer.
func TestCheck(t *testing.T) {
	res := Result{
		Accounts: []Account{{ID: "alice", Balance: 75_00}, {ID: "bob", Balance: 100_00}, {ID: "carol", Balance: 100_00}, {ID: "dave", Balance: 100_00}},
		Ledger:   []Outcome{{Transfer: Transfer{ID: "t1", From: "alice", To: "bob", Amount: 25_00}}},
	}
	require.ErrorContains(t, check(res), "bob has $100.00, the ledger says $125.00")
	res.Accounts[1].Balance = 125_00
	require.NoError(t, check(res))
}

// TestCommand runs the command as `go run ./examples/transfer` does, on the
// embedded servers, and checks what it prints.
func TestCommand(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_ADDR=") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, commandEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Empty(t, stderr.String())
	assert.Equal(t, 8, strings.Count(out, ": moved $"))
	assert.Regexp(t, `worker-\d +t\d: locked \w+ \(fence \d+\) and \w+ \(fence \d+\)`, out)
	assert.Contains(t, out, "the balances add up to $400.00, as they opened with $400.00")
	assert.Contains(t, out, "no money lost or made")
}
