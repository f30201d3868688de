package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/examples/internal/demotest"
	"github.com/fencelock/fencelock/fencesql"
)

func TestMain(m *testing.M) {
	demotest.Main(m, command)
}

// TestStory runs the story against each combination of embedded and real
// servers and checks what happened: one token per expiry with the lock,
// more and refused calls without it.
func TestStory(t *testing.T) {
	setups := []demotest.Setup{demotest.Embedded, demotest.WithRedis, demotest.WithPostgres, demotest.WithRedisAndPostgres}
	demotest.Run(t, setups, func(t *testing.T, redisAddr, databaseURL string) {
		cfg := Config{RedisAddr: redisAddr, DatabaseURL: databaseURL, Out: demotest.Output(t)}
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)
		checkLocked(t, res.Locked)
		checkUnlocked(t, res.Unlocked, res.Locked)
		demotest.KeysGone(t, redisAddr, res.Keys)
		demotest.TablesGone(t, databaseURL, res.Table, res.Fences, res.Fences+"_keys")
	})
}

// checkLocked checks the run with the lock: in every round, one instance
// got a token from the API under the lock and the other three waited for
// the lock and reused it; no API call was refused.
func checkLocked(t *testing.T, r RunResult) {
	t.Helper()
	assert.True(t, r.Locked)
	assert.GreaterOrEqual(t, r.Expiries, 3, "expiries in 1.2s of 400ms tokens")
	assert.Equal(t, r.Expiries, r.API.Issued, "one token issued per expiry")
	assert.Zero(t, r.API.Failed(), "refused calls: %v", r.API.Refused)
	assert.Positive(t, r.API.Calls)

	rounds := make(map[int][]Refresh)
	for _, f := range r.Refreshes {
		rounds[f.Tick] = append(rounds[f.Tick], f)
	}
	assert.Len(t, rounds, r.Expiries, "rounds of refreshes")
	tokens := make(map[string]bool)
	for tick, fs := range rounds {
		waited := false
		require.Len(t, fs, len(instanceNames), "refreshes in the round of tick %d", tick)
		issuer := fs[0] // the first to get the lock, as recorded in order
		assert.True(t, issuer.Issued, "the first holder of round %d asked the API", tick)
		assert.False(t, tokens[issuer.Token], "token %s issued twice", issuer.Token)
		tokens[issuer.Token] = true
		for _, f := range fs[1:] {
			assert.False(t, f.Issued, "%s asked the API in round %d", f.Instance, tick)
			assert.Equal(t, issuer.Token, f.Token, "%s's token in round %d", f.Instance, tick)
			assert.Greater(t, f.Fence, issuer.Fence, "%s held the lock after %s", f.Instance, issuer.Instance)
			waited = waited || f.Waited > issueLatency/2
		}
		// The others came to the lock while the issuer refreshed: one at
		// least waited, whichever the machine ran late.
		assert.True(t, waited, "in the round of tick %d, one of the others waited for the lock while %s refreshed: %v",
			tick, issuer.Instance, fs)
	}
}

// checkUnlocked checks the run without the lock: more tokens than expiries,
// and calls refused because the instances revoked each other's tokens.
func checkUnlocked(t *testing.T, r, locked RunResult) {
	t.Helper()
	assert.False(t, r.Locked)
	assert.Greater(t, r.API.Issued, r.Expiries, "tokens issued without the lock")
	assert.Greater(t, r.API.Issued, locked.API.Issued, "tokens issued without the lock")
	assert.Positive(t, r.API.Refused["revoked"], "calls refused with a revoked token: %v", r.API.Refused)
	for _, f := range r.Refreshes {
		assert.Zero(t, f.Fence, "a fence without the lock")
	}
}

// TestStoreIsFenced checks the fenced write on its own: it stores a token
// only with a fence at least the newest the guard recorded for the API
// (equal: the same lease storing again).
func TestStoreIsFenced(t *testing.T) {
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, "")
	require.NoError(t, err)
	defer db.Close()
	q := newQueries(db, "tokens_test", "fences_test")
	require.NoError(t, q.createTables(ctx, db))
	_, err = db.ExecContext(ctx, q.insert, "api")
	require.NoError(t, err)

	expires := time.UnixMilli(time.Now().Add(time.Minute).UnixMilli())
	tests := []struct {
		token string
		fence int64
		want  error
	}{
		{token: "tok-1", fence: 10},
		{token: "tok-2", fence: 5, want: fencesql.ErrStale}, // older than the guard's 10
		{token: "tok-3", fence: 10},                         // the same lease again
		{token: "tok-4", fence: 20},
		{token: "tok-5", fence: 19, want: fencesql.ErrStale},
	}
	for _, tt := range tests {
		err := q.storeFenced(ctx, db, "api", tt.token, expires, "test", tt.fence)
		if tt.want == nil {
			assert.NoError(t, err, "store %s with fence %d", tt.token, tt.fence)
		} else {
			assert.ErrorIs(t, err, tt.want, "store %s with fence %d", tt.token, tt.fence)
		}
	}
	got, err := q.read(ctx, db, "api")
	require.NoError(t, err)
	assert.Equal(t, stored{Token: "tok-4", Expires: expires, By: "test"}, got)
}

// TestCommand runs the command as `go run ./examples/tokenrefresh` does.
func TestCommand(t *testing.T) {
	out := demotest.RunCommand(t)

	summary := regexp.MustCompile(`(with|without) the lock: (\d+) expiries, (\d+) tokens issued, \d+ API calls, (\d+) refused`)
	got := make(map[string][3]int)
	for _, m := range summary.FindAllStringSubmatch(out, -1) {
		var n [3]int
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+2])
		}
		got[m[1]] = n
	}
	require.Len(t, got, 2, "summary lines")
	with, without := got["with"], got["without"]
	assert.Equal(t, with[0], with[1], "with the lock: one token per expiry")
	assert.Zero(t, with[2], "with the lock: refused calls")
	assert.Greater(t, without[1], without[0], "without the lock: tokens issued per expiry")
	assert.Positive(t, without[2], "without the lock: refused calls")
	assert.Contains(t, out, "stored it (fenced write)")
	assert.Regexp(t, `got token:quotes after \d+ms`, out)
}

// TestCommandBadInput checks that bad configuration ends the command with a
// clear message and exit code 1.
func TestCommandBadInput(t *testing.T) {
	tests := []struct{ env, want string }{
		{"REDIS_ADDR=localhost", `REDIS_ADDR "localhost": want host:port or a redis:// URL`},
		{"REDIS_ADDR=127.0.0.1:1", "redis at 127.0.0.1:1 does not answer"},
		{"DATABASE_URL=sqlite:///tmp/x.db", "DATABASE_URL must be a postgres:// or postgresql:// URL"},
		{"DATABASE_URL=postgres://postgres:secret@127.0.0.1:1/test", "postgresql does not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			demotest.BadInput(t, "tokenrefresh", tt.env, tt.want)
		})
	}
}
