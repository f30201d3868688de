package fencelock

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
)

// adviceRules returns the ACL rules the NOPERM advice tells a user to
// grant, read from its text, with <KeyPrefix> replaced by prefix. What the
// advice says in parentheses (Redis 6, Options.Replicas, Cluster clients)
// does not apply to the test's servers and is left out.
func adviceRules(t *testing.T, prefix string) []string {
	t.Helper()
	msg := advice("x", testRedisError("NOPERM this user has no permissions to run the 'evalsha' command"))
	msg = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(msg, "")
	var rules []string
	for _, f := range strings.FieldsFunc(msg, func(r rune) bool { return r == ' ' || r == ',' }) {
		if strings.ContainsAny(f[:1], "+-~&") {
			rules = append(rules, strings.ReplaceAll(f, "<KeyPrefix>", prefix))
		}
	}
	require.NotEmpty(t, rules, "the advice names rules: %s", msg)
	t.Logf("the advice's rules: %s", strings.Join(rules, " "))
	return rules
}

// aclClient creates the ACL user with rules on srv and returns a client
// logged in as that user.
func aclClient(t *testing.T, srv *redistest.Server, user string, rules []string) *redis.Client {
	t.Helper()
	args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	_, err := srv.Do(args...)
	require.NoError(t, err)
	return srv.Client(&redis.Options{Username: user, Password: "pw"})
}

// patient are Options under which a waiter that is not woken by a release
// sleeps 10 minutes between attempts: a wait that ends within wokenWithin
// of the release was woken by it.
var patient = &Options{MinRetryBackoff: 10 * time.Minute, MaxRetryBackoff: 10 * time.Minute}

// wokenWithin bounds how long after a release a patient waiter has the
// lock: far less than its pause between attempts, and long enough for a
// busy machine (with 10s pauses and 3s, the bound was the machine's
// speed).
const wokenWithin = 30 * time.Second

// requireWaiting waits until a waiter for the lock key subscribed to its
// channel on srv, as seen by the default user.
func requireWaiting(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	assert.Eventually(t, func() bool { return shardSubscribers(t, srv, key) >= 1 },
		wokenWithin, 10*time.Millisecond, "the waiter subscribed")
}

// checks returns the Check names of l's findings, with their count.
func checks(t *testing.T, l *Locker) map[string]int {
	t.Helper()
	fs, err := l.Check(ctx)
	require.NoError(t, err)
	by := map[string]int{}
	for _, f := range fs {
		t.Log(f)
		by[f.Check]++
	}
	return by
}

// TestACLAdviceIsEnough builds an ACL user from the NOPERM advice's own
// text and runs every public call as that user: each works, waiters are
// woken by releases (they do not poll), and Check finds what it finds for
// the default user, nothing more.
func TestACLAdviceIsEnough(t *testing.T) {
	t.Parallel()
	rules := adviceRules(t, "lock:")

	t.Run("one server", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		c := aclClient(t, srv, "app", rules)
		l, err := New(c, patient)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		name := uniqueName(t)

		held, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, held.Extend(ctx, time.Minute))
		ttl, err := held.TTL(ctx)
		require.NoError(t, err)
		assert.Greater(t, ttl, 30*time.Second, "Lease.TTL")
		info, err := l.Inspect(ctx, name)
		assert.NoError(t, err, "Inspect")
		assert.Equal(t, held.Fence(), info.Fence, "Inspect")

		for _, opts := range [][]Option{{WithWait(time.Minute)}, {WithWait(time.Minute), WithFair()}} {
			got := acquireInBackground(t, l, name, opts...)
			requireWaiting(t, srv, held.Key())
			released := time.Now()
			require.NoError(t, held.Release(ctx))
			held = requireAcquired(t, got, wokenWithin, "woken by the release").lease
			t.Logf("%v: obtained %v after the release", opts, time.Since(released))
			assert.Less(t, time.Since(released), wokenWithin, "woken by the release, not by polling")
		}
		require.NoError(t, held.Release(ctx))

		ran := false
		require.NoError(t, l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
			ran = true
			return lease.Extend(ctx, time.Minute)
		}))
		assert.True(t, ran)

		admin := checkLocker(t, srv.Client(nil), nil)
		assert.Equal(t, checks(t, admin), checks(t, l), "Check as the advice's user finds what it finds as the default user")
	})

	t.Run("Redlock", func(t *testing.T) {
		t.Parallel()
		var (
			srvs            []*redistest.Server
			clients, admins []redis.UniversalClient
		)
		for range 3 {
			srv := redistest.Start(t)
			srvs = append(srvs, srv)
			clients = append(clients, aclClient(t, srv, "app", rules))
			admins = append(admins, srv.Client(nil))
		}
		newRedlock := func(clients []redis.UniversalClient) *Locker {
			l, err := NewRedlock(clients, patient)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			return l
		}
		a, b := newRedlock(clients), newRedlock(clients)
		name := uniqueName(t)

		held, err := a.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, held.Extend(ctx, time.Minute))
		ttl, err := held.TTL(ctx)
		require.NoError(t, err)
		assert.Greater(t, ttl, 30*time.Second, "Lease.TTL")
		info, err := a.Inspect(ctx, name)
		assert.NoError(t, err, "Inspect")
		assert.Equal(t, held.Fence(), info.Fence, "Inspect")

		// Held on two nodes of three: the waiter's attempts find it busy on
		// the line's node and another, and free on the third.
		require.NoError(t, admins[2].Del(ctx, held.Key()).Err())
		got := acquireInBackground(t, b, name, WithWait(time.Minute))
		requireWaiting(t, srvs[0], held.Key())
		select {
		case r := <-got:
			t.Fatalf("the waiter returned while the lock was held: %v", r.err)
		case <-time.After(200 * time.Millisecond):
		}
		// In the first node's line (an attempt whose answer from that node
		// came after the others' grace is out of line, and listens on every
		// node, until a later one joins).
		assert.Eventually(t, func() bool { return admins[0].ZCard(ctx, held.Key()+":q").Val() == 1 },
			wokenWithin, 10*time.Millisecond, "the waiter is in the first node's line")
		released := time.Now()
		require.NoError(t, held.Release(ctx))
		next := requireAcquired(t, got, wokenWithin, "woken by the release").lease
		t.Logf("obtained %v after the release", time.Since(released))
		assert.Less(t, time.Since(released), wokenWithin, "woken by the release, not by polling")
		assert.Greater(t, next.Fence(), held.Fence())
		require.NoError(t, next.Release(ctx))

		require.NoError(t, b.RunWithLock(ctx, name, func(context.Context, *Lease) error { return nil }))
		assert.Equal(t, checks(t, newRedlock(admins)), checks(t, a),
			"Check as the advice's user finds what it finds as the default user")
	})
}

// TestACLCheckFindsEachMissingRule: for a user granted all the advice's
// rules but one, Check reports a permissions finding.
func TestACLCheckFindsEachMissingRule(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rules := adviceRules(t, "lock:")
	// refusals returns the findings of Check about what the user may not
	// do.
	refusals := func(rules []string, user string) []string {
		fs, err := checkLocker(t, aclClient(t, srv, user, rules), nil).Check(ctx)
		require.NoError(t, err)
		var out []string
		for _, f := range fs {
			if f.Check == "permissions" || f.Check == "config" {
				out = append(out, f.String())
			}
		}
		return out
	}
	require.Empty(t, refusals(rules, "all"), "with every rule of the advice")
	for i, rule := range rules {
		assert.NotEmpty(t, refusals(slices.Delete(slices.Clone(rules), i, i+1), "without"+strconv.Itoa(i)),
			"without %s: Check reports it", rule)
	}
}

// TestACLRulesCoverTheScripts reads every script, the library's and the
// fencelock command's, for the commands it calls: each is in aclRules.
func TestACLRulesCoverTheScripts(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("internal/script/*.lua")
	require.NoError(t, err)
	cmdFiles, err := filepath.Glob("cmd/fencelock/*.lua")
	require.NoError(t, err)
	files = append(files, cmdFiles...)
	require.NotEmpty(t, files)
	granted := map[string]bool{}
	for _, r := range aclRules {
		granted[r.rule], granted[r.redis6] = true, true
		cmd, _, _ := strings.Cut(r.rule, "|") // a subcommand's rule names its command
		granted[cmd] = true
	}
	call := regexp.MustCompile(`redis\.p?call\s*[(,]\s*['"]([A-Za-z]+)['"]`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		calls := call.FindAllStringSubmatch(string(src), -1)
		assert.NotEmpty(t, calls, "%s calls Redis", f)
		for _, m := range calls {
			assert.True(t, granted["+"+strings.ToLower(m[1])], "%s calls %s: aclRules must name it", f, m[1])
		}
	}
}

// TestACLAdviceForAScriptsRefusal: Redis 7.0 reports a command of a script
// that the ACL refuses as ERR, not NOPERM; the advice lists the rules.
func TestACLAdviceForAScriptsRefusal(t *testing.T) {
	t.Parallel()
	msg := advice("x", testRedisError("ERR The user executing the script can't run this command or subcommand script: "+
		script.RedlockGrant.Hash.(string)+", on @user_script:77."))
	assert.Equal(t, "ERR The user executing the script can't run this command or subcommand: "+aclAdvice(), msg)
}
