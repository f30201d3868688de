package fencelock

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// adviceRulesWith returns adviceRules and, read from the advice's
// parentheses, the rules it says are needed "with" each of conds, with
// <KeyPrefix> replaced by prefix.
func adviceRulesWith(t *testing.T, prefix string, conds ...string) []string {
	t.Helper()
	rules := adviceRules(t, prefix)
	msg := advice("x", testRedisError("NOPERM this user has no permissions to run the 'evalsha' command"))
	for _, cond := range conds {
		var got []string
		for _, m := range regexp.MustCompile(`with `+regexp.QuoteMeta(cond)+` ([^,;)]*)`).FindAllStringSubmatch(msg, -1) {
			for _, f := range strings.Fields(m[1]) {
				if strings.ContainsAny(f[:1], "+-~&") {
					got = append(got, strings.ReplaceAll(f, "<KeyPrefix>", prefix))
				}
			}
		}
		require.NotEmpty(t, got, "the advice names the rules needed with %s: %s", cond, msg)
		t.Logf("with %s: %s", cond, strings.Join(got, " "))
		rules = append(rules, got...)
	}
	return rules
}

// TestACLAdviceOnAnotherDatabase: go-redis sends SELECT when it sets up a
// connection to a database other than 0. A user made from the advice,
// with what it says that database needs, takes, releases and wakes.
func TestACLAdviceOnAnotherDatabase(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rules := adviceRulesWith(t, "lock:", "a database other than 0")
	_, err := srv.Do(append([]any{"ACL", "SETUSER", "db3", "reset", "on", ">pw"}, toAny(rules)...)...)
	require.NoError(t, err)
	c := srv.Client(&redis.Options{Username: "db3", Password: "pw", DB: 3})
	l, err := New(c, patient)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)

	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	got := acquireInBackground(t, l, name, WithWait(time.Minute))
	requireWaiting(t, srv, held.Key()+"@3")
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	next := requireAcquired(t, got, 5*time.Second, "woken by the release").lease
	assert.Less(t, time.Since(released), 3*time.Second, "woken by the release, not by polling")
	require.NoError(t, next.Release(ctx))
	n, err := srv.Client(&redis.Options{DB: 3}).Exists(ctx, held.Key()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock was on database 3, and is released")

	by := findings(t, l)
	assert.Empty(t, by["permissions"], "Check as the advice's user on database 3")

	// Without +select, Check says so.
	var without []any
	for _, r := range rules {
		if r != "+select" {
			without = append(without, r)
		}
	}
	_, err = srv.Do(append([]any{"ACL", "SETUSER", "noselect", "reset", "on", ">pw"}, without...)...)
	require.NoError(t, err)
	by = findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "noselect", Password: "pw", DB: 3}), nil))
	require.Len(t, by["permissions"], 1, "SELECT refused, which refuses every command after it")
	assert.Contains(t, by["permissions"][0].Fix, "+select")
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
