package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demotest"
)

func TestMain(m *testing.M) {
	demotest.Main(m, command)
}

// TestStory runs the story against each combination of embedded and real
// servers and checks what happened: every transfer moved its money once.
func TestStory(t *testing.T) {
	setups := []demotest.Setup{demotest.Embedded, demotest.WithRedis, demotest.WithPostgres}
	demotest.Run(t, setups, func(t *testing.T, redisAddr, databaseURL string) {
		cfg := Config{RedisAddr: redisAddr, DatabaseURL: databaseURL, Out: demotest.Output(t)}
		cfg.Stderr = cfg.Out
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)
		checkStory(t, res)
		demotest.KeysGone(t, redisAddr, res.Keys)
		demotest.TablesGone(t, databaseURL, res.Tables...)
	})
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
	out := demotest.RunCommand(t)
	assert.Equal(t, 8, strings.Count(out, ": moved $"))
	assert.Regexp(t, `worker-\d +t\d: locked \w+ \(fence \d+\) and \w+ \(fence \d+\)`, out)
	assert.Contains(t, out, "the balances add up to $400.00, as they opened with $400.00")
	assert.Contains(t, out, "no money lost or made")
}
