package conformance

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
)

// deadline: on a paused (SIGSTOPped) server, an Acquire returns by its
// context's deadline with an error matching it and no verdict; once the
// server runs again, the lock is not left held.
func (s *suite) deadline(t *testing.T) {
	srv := redistest.Start(t)
	l := s.locker(t, targetOf(srv), nil)
	name := nameOf(t, "")
	warm, err := l.Acquire(callCtx(t), name+".warm")
	require.NoError(t, err, "before the pause")
	release(t, warm)
	pause(t, srv)

	const d = 300 * time.Millisecond
	for _, tc := range []struct {
		what string
		opts []fencelock.Option
	}{
		{"try once", nil},
		{"WithWait", []fencelock.Option{fencelock.WithWait(time.Minute)}},
	} {
		ctx, cancel := context.WithTimeout(bg, d)
		start := time.Now()
		_, err := l.Acquire(ctx, name+"."+tc.what, append(tc.opts, fencelock.WithTTL(2*time.Second))...)
		elapsed := time.Since(start)
		cancel()
		t.Logf("%s: returned %v after its %v deadline: %v", tc.what, (elapsed - d).Round(time.Millisecond), d, err)
		require.Error(t, err, tc.what)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%s: matches ctx's error", tc.what)
		assert.NotErrorIs(t, err, fencelock.ErrNotObtained, "%s: a paused server is not busy", tc.what)
		assert.NotErrorIs(t, err, fencelock.ErrUnavailable, "%s: no verdict before the deadline", tc.what)
		assert.NotErrorIs(t, err, fencelock.ErrMisconfigured, tc.what)
		assert.Less(t, elapsed, 2*time.Second, "%s: returns by its deadline, not by a client timeout", tc.what)
	}

	// Running again, the server gets what the attempts left in flight: the
	// clean-up deletes a lock they took, or its 2s TTL ends it.
	srv.Resume()
	for _, tc := range []string{"try once", "WithWait"} {
		key := lockKey(name + "." + tc)
		require.Eventually(t, func() bool { return !keyExists(t, srv, key) }, within, 10*time.Millisecond,
			"%s: the lock is not left held", tc)
	}
	lease, err := l.Acquire(callCtx(t), name+".try once")
	require.NoError(t, err, "free again after the resume")
	release(t, lease)
}

// replicas: with Options.Replicas, an acquisition waits for a replica's
// acknowledgement; with the only replica paused, it fails as unavailable.
func (s *suite) replicas(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	l := s.locker(t, targetOf(master), &fencelock.Options{Replicas: 1, ReplicaTimeout: 200 * time.Millisecond})
	ctx := callCtx(t)
	name := nameOf(t, "")

	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "the replica acknowledges")
	v, err := replica.Do("GET", lease.Key())
	require.NoError(t, err)
	got, _ := v.(string)
	assert.True(t, strings.HasPrefix(got, lease.Token()+" "), "on the replica when Acquire returns: %q", got)
	require.NoError(t, lease.Extend(ctx, time.Minute), "Extend, acknowledged")
	release(t, lease)

	pause(t, replica)
	_, err = l.Acquire(ctx, name+".unacknowledged")
	require.ErrorIs(t, err, fencelock.ErrUnavailable, "no replica acknowledges")
	assert.NotErrorIs(t, err, fencelock.ErrNotObtained)
	assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged")
	require.Eventually(t, func() bool { return !keyExists(t, master, lockKey(name+".unacknowledged")) },
		within, 10*time.Millisecond, "the lock no replica acknowledged is given back")
}

// cluster: on a Cluster of three masters, locks in every master's slots
// exclude the other client's; a release wakes a waiter through sharded
// pub/sub; AcquireAll takes names of one slot and of several.
func (s *suite) cluster(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	target := Target{Addrs: c.Addrs(), Cluster: true}
	l := s.locker(t, target, patient())
	ref := reference(t, target, patient())
	ctx := callCtx(t)

	// A name whose lock is on each master.
	var names []string
	masters := map[*redistest.Server]string{}
	for i := 0; len(masters) < len(c.Masters); i++ {
		require.Less(t, i, 1000, "names on every master")
		name := nameOf(t, fmt.Sprintf(".%d", i))
		if m := c.MasterOf(keys.Slot(lockKey(name))); masters[m] == "" {
			masters[m] = name
			names = append(names, name)
		}
	}
	for _, name := range names {
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err, name)
		_, err = ref.Acquire(ctx, name)
		requireBusy(t, err, "%s: go-redis's Acquire", name)
		_, err = l.Acquire(ctx, name)
		requireBusy(t, err, "%s: %s's Acquire", name, s.c.Name)
		require.NoError(t, lease.Extend(ctx, time.Minute), name)
		release(t, lease)
		again, err := ref.Acquire(ctx, name)
		require.NoError(t, err, name)
		assert.Greater(t, again.Fence(), lease.Fence(), name)
		_, err = l.Acquire(ctx, name)
		requireBusy(t, err, "%s: %s's Acquire", name, s.c.Name)
		release(t, again)
	}

	// Wake-ups through sharded pub/sub on the master of the lock's slot.
	for i, tc := range []struct {
		what           string
		holder, waiter *fencelock.Locker
	}{
		{"go-redis releases, " + s.c.Name + " waits", ref, l},
		{s.c.Name + " releases, go-redis waits", l, ref},
		{s.c.Name + " releases, " + s.c.Name + " waits", l, l},
	} {
		name := names[i%len(names)]
		held, err := tc.holder.Acquire(ctx, name, fencelock.WithTTL(holdTTL))
		require.NoError(t, err, tc.what)
		got := acquireInBackground(t, tc.waiter, name, fencelock.WithWait(2*holdTTL))
		requireSubscribed(t, c.MasterOf(keys.Slot(held.Key())), held.Key())
		requireNotYet(t, got, tc.what+": the waiter")
		released := time.Now()
		release(t, held)
		r := requireAcquired(t, got, within, tc.what+": woken by the release")
		t.Logf("%s: obtained %v after the release", tc.what, r.at.Sub(released).Round(time.Millisecond))
		assert.Greater(t, r.lease.Fence(), held.Fence())
		release(t, r.lease)
	}

	// AcquireAll of names whose keys share a slot (one script), and of
	// names on every master (one by one).
	base := names[0]
	same := []string{base}
	for i := 0; len(same) < 3; i++ {
		require.Less(t, i, 1_000_000, "names in the slot of %s", base)
		if n := fmt.Sprintf("%s:%d", base, i); keys.Slot(lockKey(n)) == keys.Slot(lockKey(base)) {
			same = append(same, n)
		}
	}
	for _, set := range [][]string{same, names} {
		leases, err := l.AcquireAll(ctx, set)
		require.NoError(t, err, "AcquireAll(%q)", set)
		require.Len(t, leases, len(set))
		for i, lease := range leases {
			assert.Equal(t, set[i], lease.Name())
			_, err := ref.Acquire(ctx, set[i])
			requireBusy(t, err, "%s held by AcquireAll", set[i])
		}
		_, err = ref.AcquireAll(ctx, set)
		requireBusy(t, err, "go-redis's AcquireAll(%q)", set)
		for _, lease := range leases {
			release(t, lease)
		}
		leases, err = ref.AcquireAll(ctx, set)
		require.NoError(t, err, "go-redis's AcquireAll(%q) once released", set)
		_, err = l.AcquireAll(ctx, set)
		requireBusy(t, err, "%s's AcquireAll(%q)", s.c.Name, set)
		for _, lease := range leases {
			release(t, lease)
		}
	}
}

// redlock: NewRedlock on three servers takes and releases locks, excluding
// go-redis's NewRedlock on the same servers, and obtains them with one
// server paused (a quorum of two).
func (s *suite) redlock(t *testing.T) {
	var (
		srvs    []*redistest.Server
		targets []Target
	)
	for range 3 {
		srv := redistest.Start(t)
		srvs = append(srvs, srv)
		targets = append(targets, targetOf(srv))
	}
	l := s.redlockOn(t, targets, nil)
	ref := referenceRedlock(t, targets, nil)
	ctx := callCtx(t)
	name := nameOf(t, "")

	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Positive(t, lease.Fence())
	held := 0
	for _, srv := range srvs {
		if keyExists(t, srv, lease.Key()) {
			held++
		}
	}
	assert.GreaterOrEqual(t, held, 2, "held on a quorum")
	_, err = ref.Acquire(ctx, name)
	requireBusy(t, err, "go-redis's Acquire")
	_, err = l.Acquire(ctx, name)
	requireBusy(t, err, "%s's Acquire", s.c.Name)
	require.NoError(t, lease.Extend(ctx, time.Minute))
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, lease.Fence(), info.Fence)
	release(t, lease)

	again, err := ref.Acquire(ctx, name)
	require.NoError(t, err, "go-redis's Acquire once released")
	assert.Greater(t, again.Fence(), lease.Fence())
	_, err = l.Acquire(ctx, name)
	requireBusy(t, err, "%s's Acquire", s.c.Name)
	release(t, again)
	last := again.Fence()

	pause(t, srvs[2])
	start := time.Now()
	lease, err = l.Acquire(ctx, name)
	require.NoError(t, err, "a quorum of two of three obtains")
	t.Logf("obtained with a server paused in %v", time.Since(start).Round(time.Millisecond))
	assert.Greater(t, lease.Fence(), last)
	_, err = ref.Acquire(ctx, name)
	requireBusy(t, err, "go-redis's Acquire with a server paused")
	release(t, lease)
	require.NoError(t, l.RunWithLock(ctx, name, func(context.Context, *fencelock.Lease) error { return nil }),
		"RunWithLock with a server paused")
}

// acl: a refusal by the ACL is ErrMisconfigured naming the rule to grant; a
// user with the rules the advice names works, and Check finds nothing to
// grant it; a user without the pub/sub rules gets a permissions finding.
func (s *suite) acl(t *testing.T) {
	srv := redistest.Start(t)
	ctx := callCtx(t)
	name := nameOf(t, "")
	user := func(name string, rules ...string) Target {
		t.Helper()
		args := []any{"ACL", "SETUSER", name, "reset", "on", ">pw"}
		for _, r := range rules {
			args = append(args, r)
		}
		_, err := srv.Do(args...)
		require.NoError(t, err, "ACL SETUSER %s", name)
		return Target{Addrs: []string{srv.Addr}, Username: name, Password: "pw"}
	}

	// Without scripting.
	l := s.locker(t, user("noscript", "~*", "&*", "+@all", "-@scripting"), nil)
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, fencelock.ErrMisconfigured, "an Acquire the ACL refuses")
	assert.NotErrorIs(t, err, fencelock.ErrUnavailable)
	msg := err.Error()
	assert.NotContains(t, msg, "\n", "one line")
	assert.Contains(t, msg, "NOPERM", "says what Redis refused")
	assert.Regexp(t, `'(evalsha|eval|fcall)'`, msg, "names the refused command")
	assert.Contains(t, msg, "+@scripting", "names the rule to grant")

	// The rules the advice names (outside its parentheses: Redis 6, other
	// options), for the default KeyPrefix.
	var rules []string
	for _, f := range strings.FieldsFunc(regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(msg, ""),
		func(r rune) bool { return r == ' ' || r == ',' || r == ';' }) {
		if strings.ContainsAny(f[:1], "+-~&") {
			rules = append(rules, strings.ReplaceAll(f, "<KeyPrefix>", "lock:"))
		}
	}
	require.Subset(t, rules, []string{"+@scripting", "+spublish", "+ssubscribe"}, "the advice's rules: %s", msg)

	advised := s.locker(t, user("advised", rules...), patient())
	held, err := advised.Acquire(ctx, name, fencelock.WithTTL(holdTTL))
	require.NoError(t, err, "as the advice's user")
	got := acquireInBackground(t, advised, name, fencelock.WithWait(2*holdTTL))
	requireSubscribed(t, srv, held.Key())
	release(t, held)
	r := requireAcquired(t, got, within, "as the advice's user: woken by the release")
	release(t, r.lease)
	fs, err := advised.Check(ctx)
	require.NoError(t, err)
	for _, f := range fs {
		t.Log(f)
		assert.NotEqual(t, "permissions", f.Check, "Check as the advice's user: %s", f)
	}

	// Without the pub/sub rules.
	nopub := slices.DeleteFunc(slices.Clone(rules), func(r string) bool { return r == "+spublish" || r == "+ssubscribe" })
	l = s.locker(t, user("nopubsub", nopub...), nil)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "without pub/sub rules: locks still work")
	release(t, lease)
	fs, err = l.Check(ctx)
	require.NoError(t, err)
	var fixes []string
	for _, f := range fs {
		t.Log(f)
		if f.Check == "permissions" {
			fixes = append(fixes, f.Fix)
		}
	}
	require.NotEmpty(t, fixes, "Check without +spublish and +ssubscribe reports permissions")
	assert.True(t, slices.ContainsFunc(fixes, func(fix string) bool {
		return strings.Contains(fix, "+spublish") || strings.Contains(fix, "+ssubscribe") || strings.Contains(fix, "&lock:*")
	}), "a permissions finding names a missing rule: %q", fixes)
}

// errors: a closed client and a refused login are misconfigured, not
// unavailable (which an Acquire would retry).
func (s *suite) errors(t *testing.T) {
	srv := redistest.Start(t)
	name := nameOf(t, "")

	for _, used := range []bool{false, true} {
		l, closeClient, err := s.c.New(targetOf(srv), nil)
		require.NoError(t, err, "New")
		t.Cleanup(func() { _ = l.Close() })
		if used {
			lease, err := l.Acquire(callCtx(t), name)
			require.NoError(t, err)
			release(t, lease)
		}
		closeClient()
		_, err = l.Acquire(callCtx(t), name, fencelock.WithWait(time.Minute))
		require.ErrorIs(t, err, fencelock.ErrMisconfigured, "Acquire on a closed client (used before: %v)", used)
		assert.NotErrorIs(t, err, fencelock.ErrUnavailable)
		assert.NotErrorIs(t, err, fencelock.ErrNotObtained)
		assert.NotContains(t, err.Error(), "\n", "one line")
		t.Logf("closed client (used before: %v): %v", used, err)
	}

	secured := redistest.Start(t)
	_, err := secured.Do("CONFIG", "SET", "requirepass", "secret")
	require.NoError(t, err)
	for _, tc := range []struct {
		what, password, code string
	}{
		{"wrong password", "wrong", "WRONGPASS"},
		{"no password", "", "NOAUTH"},
	} {
		l, closeClient, err := s.c.New(Target{Addrs: []string{secured.Addr}, Password: tc.password}, nil)
		if err != nil {
			t.Logf("%s: New fails: %v", tc.what, err)
			if closeClient != nil {
				closeClient()
			}
			continue
		}
		t.Cleanup(func() { _ = l.Close(); closeClient() })
		_, err = l.Acquire(callCtx(t), name, fencelock.WithWait(time.Minute))
		t.Logf("%s: Acquire fails: %v", tc.what, err)
		require.ErrorIs(t, err, fencelock.ErrMisconfigured, tc.what)
		assert.NotErrorIs(t, err, fencelock.ErrUnavailable, tc.what)
		assert.Contains(t, err.Error(), tc.code, "%s: says what Redis refused", tc.what)
		assert.Contains(t, err.Error(), "Password", "%s: says what to fix", tc.what)
	}
}
