package fencelock

import (
	"context"
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
	next := requireAcquired(t, got, wokenWithin, "woken by the release").lease
	assert.Less(t, time.Since(released), wokenWithin, "woken by the release, not by polling")
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

// clusterUser creates the ACL user with rules on every master of c and
// returns a cluster client logged in as that user.
func clusterUser(t *testing.T, c *redistest.Cluster, user string, rules []string) *redis.ClusterClient {
	t.Helper()
	for _, m := range c.Masters {
		_, err := m.Do(append([]any{"ACL", "SETUSER", user, "reset", "on", ">pw"}, toAny(rules)...)...)
		require.NoError(t, err)
	}
	return c.Client(&redis.ClusterOptions{Username: user, Password: "pw"})
}

func without(rules []string, rule string) []string {
	var out []string
	for _, r := range rules {
		if r != rule {
			out = append(out, r)
		}
	}
	return out
}

// TestACLAdviceOnACluster: a user made from the advice, with what it says
// a Cluster client needs, takes a lock while its slot migrates (go-redis
// answers ASK with ASKING) and is not refused COMMAND (go-redis's command
// info); Check finds nothing to grant it, and names ASKING and COMMAND
// for a user without them.
func TestACLAdviceOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 3, 0)
	rules := adviceRulesWith(t, "lock:", onlyCluster)
	require.Subset(t, rules, []string{"+cluster|slots", "+asking", "+command"})
	client := clusterUser(t, c, "app", rules)
	l := checkLocker(t, client, nil)
	assert.Empty(t, findings(t, l)["permissions"], "Check as the advice's user")

	for _, rule := range []string{"+asking", "+command"} {
		by := findings(t, checkLocker(t, clusterUser(t, c, "no"+rule[1:], without(rules, rule)), nil))
		var fixes []string
		for _, f := range by["permissions"] {
			fixes = append(fixes, f.Fix)
		}
		assert.Contains(t, fixes, "grant the ACL user "+rule, "Check as a user without %s", rule)
	}

	// The lock's slot migrating to another master: its keys are on neither,
	// so the source answers ASK.
	name := uniqueName(t)
	admin := c.Client(nil)
	slot := int(admin.ClusterKeySlot(ctx, "lock:{"+name+"}").Val())
	from := c.MasterOf(slot)
	to := c.Masters[0]
	if to == from {
		to = c.Masters[1]
	}
	_, err := to.Do("CLUSTER", "SETSLOT", slot, "IMPORTING", c.NodeID(from))
	require.NoError(t, err)
	_, err = from.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", c.NodeID(to))
	require.NoError(t, err)
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	held, err := l.Acquire(actx, name)
	cancel()
	if err != nil { // TRYAGAIN: the script's keys are not all on the importing node
		t.Logf("Acquire during the migration: %v", err)
		assert.NotErrorIs(t, err, ErrMisconfigured)
		assert.NotContains(t, err.Error(), "NOPERM")
	} else {
		require.NoError(t, held.Release(ctx))
	}
	c.MigrateSlot(slot, to)
	held, err = l.Acquire(ctx, name)
	require.NoError(t, err, "Acquire after the migration")
	require.NoError(t, held.Release(ctx))
}

// TestACLAdviceEscapesKeyPrefix: a KeyPrefix with glob characters is
// escaped in the key and channel patterns of Check's fixes, which a user
// can be made from.
func TestACLAdviceEscapesKeyPrefix(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const prefix = "svc[1]:"
	opts := &Options{KeyPrefix: prefix, MinRetryBackoff: patient.MinRetryBackoff, MaxRetryBackoff: patient.MaxRetryBackoff}

	// A user with every command and no key or channel: Check's fix for the
	// refused keys is the whole advice, for this KeyPrefix.
	_, err := srv.Do("ACL", "SETUSER", "nokeys", "reset", "on", ">pw", "+@all")
	require.NoError(t, err)
	var fix string
	for _, f := range findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "nokeys", Password: "pw"}), opts))["permissions"] {
		if strings.Contains(f.Seen, "SET {key}") {
			fix = f.Fix
		}
	}
	require.NotEmpty(t, fix, "Check reports the refused keys")
	fix = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(fix, "")
	var rules []any
	for _, f := range strings.Fields(fix) {
		if strings.ContainsAny(f[:1], "+-~&") {
			rules = append(rules, f)
		}
	}
	assert.Contains(t, rules, `~svc\[1\]:*`)
	assert.Contains(t, rules, `&svc\[1\]:*`)
	_, err = srv.Do(append([]any{"ACL", "SETUSER", "app", "reset", "on", ">pw"}, rules...)...)
	require.NoError(t, err)

	l := checkLocker(t, srv.Client(&redis.Options{Username: "app", Password: "pw"}), opts)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(held.Key(), prefix), held.Key())
	got := acquireInBackground(t, l, name, WithWait(time.Minute))
	requireWaiting(t, srv, held.Key())
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	next := requireAcquired(t, got, wokenWithin, "woken by the release").lease
	assert.Less(t, time.Since(released), wokenWithin, "woken by the release, not by polling")
	require.NoError(t, next.Release(ctx))
	assert.Empty(t, findings(t, l)["permissions"], "Check as the user made from the fix")

	// The channel fixes escape it too.
	_, err = srv.Do("ACL", "SETUSER", "nochannels", "reset", "on", ">pw", "+@all", `~svc\[1\]:*`)
	require.NoError(t, err)
	fs := findings(t, checkLocker(t, srv.Client(&redis.Options{Username: "nochannels", Password: "pw"}), opts))["permissions"]
	require.Len(t, fs, 2, "publish and subscribe")
	for _, f := range fs {
		assert.True(t, strings.HasSuffix(f.Fix, `: &svc\[1\]:*`), f.Fix)
	}
}

// TestCheckClusterPermissionsOnEveryMaster: ACLs are each node's own. A
// master whose user lacks a rule is named, on every run, whichever master
// Check's first test key falls on; the others are not.
func TestCheckClusterPermissionsOnEveryMaster(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 3, 0)
	rules := adviceRulesWith(t, "lock:", onlyCluster)
	client := clusterUser(t, c, "app", rules)
	weak := c.Masters[2]
	_, err := weak.Do(append([]any{"ACL", "SETUSER", "app", "reset", "on", ">pw"}, toAny(without(without(rules, "+hget"), "+time"))...)...)
	require.NoError(t, err)

	for range 3 { // a test key on the weak master by chance would not do
		fs := findings(t, checkLocker(t, client, nil))["permissions"]
		seen := map[string]bool{}
		for _, f := range fs {
			assert.Equal(t, weak.Addr, f.Node, "only the weak master is refused: %s", f)
			seen[strings.Fields(f.Seen)[0]] = true
		}
		assert.True(t, seen["HGET"], "HGET refused on the weak master")
		assert.True(t, seen["TIME"], "TIME refused on the weak master")
	}
	keys, err := c.Client(nil).DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, keys, "Check leaves no key on any master")
}
