package fencelock

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// The scripts as they were at commit 5fbfc5a, before the prelude and
// redlock_release.lua, are in testdata/scripts-5fbfc5a: what a library
// version of then runs on the keys that this one shares with it.
const oldScripts = "testdata/scripts-5fbfc5a/"

// compatSide runs one version's scripts on one lock name.
type compatSide struct {
	old  bool
	name string
	c    *redis.Client
	keys []string // lock, counter, queue, entries
	load func(file string) *redis.Script
}

const (
	compatEntry     = 10000   // ms, of a queue or line entry
	compatMarker    = 20000   // ms, of a released token's marker
	compatTTL       = 30000   // ms, of the locks
	compatRetention = 600000  // ms, of the fence counter
	compatAbandon   = 3600000 // ms, of an abandoned token's marker
)

func newCompatSide(t *testing.T, c *redis.Client, old bool, name string) *compatSide {
	t.Helper()
	s := &compatSide{old: old, name: name, c: c}
	k := "lock:{" + name + "}"
	s.keys = []string{k, k + ":fence", k + ":q", k + ":qi"}
	if old {
		s.load = func(file string) *redis.Script {
			src, err := os.ReadFile(oldScripts + file + ".lua")
			require.NoError(t, err)
			return redis.NewScript(string(src))
		}
	}
	return s
}

func (s *compatSide) run(ctx context.Context, sc *script.Script, keys []string, argv ...any) (any, error) {
	if s.old {
		return s.load(sc.Name).Run(ctx, s.c, keys, argv...).Result()
	}
	k := make([]any, len(keys))
	for i := range keys {
		k[i] = keys[i]
	}
	cmd := redis.NewCmd(ctx, script.Args(sc, false, k, argv)...)
	_ = s.c.Process(ctx, cmd)
	if script.IsNoScript(cmd.Err()) {
		cmd = redis.NewCmd(ctx, script.Args(sc, true, k, argv)...)
		_ = s.c.Process(ctx, cmd)
	}
	return cmd.Result()
}

func (s *compatSide) marker(token string) string { return s.keys[0] + ":t:" + token }

func (s *compatSide) all(token string) []string {
	return []string{s.keys[0], s.marker(token), s.keys[1], s.keys[2], s.keys[3]}
}

func (s *compatSide) acquire(ctx context.Context, token, owner string, fair bool) (any, error) {
	f := "0"
	if fair {
		f = "1"
	}
	return s.run(ctx, script.Acquire, s.all(token), token, compatTTL, compatRetention, owner, f, compatEntry)
}

func (s *compatSide) release(ctx context.Context, token string, mode store.Mode) (any, error) {
	ttl := compatMarker
	if mode == store.Abandon {
		ttl = compatAbandon
	}
	if s.old { // the arguments as it took them
		return s.run(ctx, script.Release, s.all(token), token, s.keys[0], string(mode), ttl, compatRetention)
	}
	return s.run(ctx, script.Release, s.all(token), token, ttl, compatRetention, string(mode))
}

func (s *compatSide) extend(ctx context.Context, token string) (any, error) {
	return s.run(ctx, script.Extend, s.keys[:1], token, compatTTL)
}

func (s *compatSide) queue(ctx context.Context, token, mode, owner string) (any, error) {
	return s.run(ctx, script.Queue, []string{s.keys[0], s.keys[2], s.keys[3]}, token, mode, compatEntry, compatTTL, owner)
}

func (s *compatSide) grant(ctx context.Context, token, fence, owner, line string) (any, error) {
	return s.run(ctx, script.RedlockGrant, s.all(token), token, compatTTL, fence, owner, compatRetention, line, compatEntry)
}

func (s *compatSide) setFence(ctx context.Context, token, fence string) (any, error) {
	return s.run(ctx, script.RedlockFence, s.keys[:2], token, fence, compatRetention)
}

// nodeRelease is a release on a Redlock node: release.lua's 'q' and 'b'
// then, redlock_release.lua's 'r' and 'a' now.
func (s *compatSide) nodeRelease(ctx context.Context, token string, mode store.Mode, line string) (any, error) {
	if s.old {
		old := map[store.Mode]string{store.Release: "q", store.Abandon: "b"}[mode]
		argv := []any{token, s.keys[0], old, compatAbandon, compatRetention}
		if line != "" {
			argv = append(argv, line)
		}
		return s.load("release").Run(ctx, s.c, s.all(token), argv...).Result()
	}
	argv := []any{token, s.keys[0], string(mode), compatAbandon}
	if line != "" {
		argv = append(argv, line)
	}
	return s.run(ctx, script.RedlockRelease, []string{s.keys[0], s.marker(token), s.keys[2], s.keys[3]}, argv...)
}

func (s *compatSide) inspect(ctx context.Context) (any, error) {
	return s.run(ctx, script.Inspect, s.keys[:2])
}

var (
	compatMillis = regexp.MustCompile(`\b1[0-9]{12}\b`) // server time in ms
	compatMicros = regexp.MustCompile(`\b1[0-9]{15}\b`) // server time in µs
)

// normal returns v with the side's name and the server times replaced, and
// each TTL (any integer of 1000 or more) by its class (see ttlClass).
func (s *compatSide) normal(v any) any {
	switch v := v.(type) {
	case string:
		v = strings.ReplaceAll(v, "{"+s.name+"}", "{N}")
		v = compatMicros.ReplaceAllString(v, "<µs>")
		return compatMillis.ReplaceAllString(v, "<ms>")
	case int64:
		return ttlClass(v)
	case float64:
		return s.normal(fmt.Sprintf("%.0f", v))
	case []any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = s.normal(v[i])
		}
		return out
	case error:
		return "error: " + s.normal(v.Error()).(string)
	}
	return v
}

func ttlClass(ms int64) any {
	if ms < 1000 {
		return ms
	}
	return pttlClass(ms)
}

// pttlClass returns the smallest of the test's TTLs that a PTTL does not
// exceed, or -1 (none) and -2 (no key).
func pttlClass(ms int64) any {
	if ms < 0 {
		return ms
	}
	for _, c := range []int64{compatEntry, compatMarker, compatTTL, compatRetention, compatAbandon} {
		if ms <= c {
			return fmt.Sprintf("ttl<=%d", c)
		}
	}
	return fmt.Sprintf("ttl>%d", compatAbandon)
}

// dump returns every key of the side, normalised: type, value, TTL class.
func (s *compatSide) dump(ctx context.Context, t *testing.T) []string {
	t.Helper()
	keys, err := s.c.Keys(ctx, "lock:{"+s.name+"}*").Result()
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		typ := s.c.Type(ctx, k).Val()
		var val any
		switch typ {
		case "string":
			val = s.c.Get(ctx, k).Val()
		case "zset":
			zs := s.c.ZRangeWithScores(ctx, k, 0, -1).Val()
			var parts []any
			for _, z := range zs {
				parts = append(parts, z.Member, z.Score)
			}
			val = parts
		case "hash":
			h := s.c.HGetAll(ctx, k).Val()
			var parts []any
			for f, v := range h {
				parts = append(parts, f+"="+v)
			}
			slices.SortFunc(parts, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
			val = parts
		}
		pttl := s.c.PTTL(ctx, k).Val().Milliseconds()
		out = append(out, fmt.Sprintf("%v %s %v %v", s.normal(k), typ, s.normal(val), pttlClass(pttl)))
	}
	slices.Sort(out)
	return out
}

// messages subscribes to the side's channels and returns what it heard.
func (s *compatSide) messages(ctx context.Context, t *testing.T) func() []string {
	t.Helper()
	sub := s.c.SSubscribe(ctx, s.keys[0], s.keys[0]+":n:ab")
	_, err := sub.Receive(ctx)
	require.NoError(t, err)
	_, err = sub.Receive(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch := sub.Channel()
	return func() []string {
		var got []string
		for {
			select {
			case m := <-ch:
				got = append(got, s.normal(m.Channel).(string)+" "+s.normal(m.Payload).(string))
			case <-time.After(30 * time.Millisecond):
				return got
			}
		}
	}
}

// TestScriptsWireCompatible runs the scripts of commit 5fbfc5a and today's
// side by side on one server, one lock name each: every step must answer
// the same, leave the same keys, values and TTLs and publish the same
// messages (or, where more says, more of the same payloads); and a holder through one version's scripts must exclude an
// acquirer through the other's, with fences increasing across them.
func TestScriptsWireCompatible(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(nil)
	ctx := context.Background()
	name := uniqueName(t)
	sides := []*compatSide{newCompatSide(t, c, true, name+".old"), newCompatSide(t, c, false, name+".new")}
	heard := []func() []string{sides[0].messages(ctx, t), sides[1].messages(ctx, t)}

	const ahead = "5000000000000000" // a counter ahead of the clock, in µs: fences count on from it
	// What today's scripts publish besides 5fbfc5a's, by step: messages an
	// old waiter takes as it takes the same message of a release (it
	// tries again). A give-back wakes the waiters as a release does:
	// 5fbfc5a's published nothing, and its waiters slept out their backoff
	// with the lock free.
	more := map[string][]string{"abandon of a held lock": {"lock:{N} released"}}
	steps := []struct {
		name string
		do   func(s *compatSide) (any, error)
	}{
		{"acquire, no counter: the fence is the clock", func(s *compatSide) (any, error) { return s.acquire(ctx, "A", "owner a", false) }},
		{"busy acquire", func(s *compatSide) (any, error) { return s.acquire(ctx, "B", "owner b", false) }},
		{"retried acquire", func(s *compatSide) (any, error) { return s.acquire(ctx, "A", "owner a", false) }},
		{"extend", func(s *compatSide) (any, error) { return s.extend(ctx, "A") }},
		{"extend by another", func(s *compatSide) (any, error) { return s.extend(ctx, "B") }},
		{"inspect", func(s *compatSide) (any, error) { return s.inspect(ctx) }},
		{"release", func(s *compatSide) (any, error) { return s.release(ctx, "A", store.Release) }},
		{"release resent", func(s *compatSide) (any, error) { return s.release(ctx, "A", store.Release) }},
		{"extend of a released lock", func(s *compatSide) (any, error) { return s.extend(ctx, "A") }},
		{"counter ahead of the clock", func(s *compatSide) (any, error) {
			return s.c.Set(ctx, s.keys[1], ahead, compatRetention*time.Millisecond).Result()
		}},
		{"acquire: the fence counts on", func(s *compatSide) (any, error) { return s.acquire(ctx, "C", "owner c", false) }},
		{"fair waiter joins", func(s *compatSide) (any, error) { return s.acquire(ctx, "D", "owner d", true) }},
		{"second fair waiter joins", func(s *compatSide) (any, error) { return s.acquire(ctx, "E", "owner e", true) }},
		{"fair keep-alive", func(s *compatSide) (any, error) { return s.queue(ctx, "D", "k", "owner d") }},
		{"a dead entry first in line", func(s *compatSide) (any, error) {
			if err := s.c.ZAdd(ctx, s.keys[2], redis.Z{Score: 1, Member: "Z"}).Err(); err != nil {
				return nil, err
			}
			return s.c.HSet(ctx, s.keys[3], "Z", "1 1000 dead").Result()
		}},
		{"release hands over", func(s *compatSide) (any, error) { return s.release(ctx, "C", store.Release) }},
		{"the granted waiter's keep-alive", func(s *compatSide) (any, error) { return s.queue(ctx, "D", "k", "owner d") }},
		{"second waiter keeps alive", func(s *compatSide) (any, error) { return s.queue(ctx, "E", "k", "owner e") }},
		{"second waiter leaves", func(s *compatSide) (any, error) { return s.queue(ctx, "E", "d", "owner e") }},
		{"gone waiter's keep-alive", func(s *compatSide) (any, error) { return s.queue(ctx, "E", "k", "owner e") }},
		{"release, nobody in line", func(s *compatSide) (any, error) { return s.release(ctx, "D", store.Release) }},
		{"abandon of a free lock", func(s *compatSide) (any, error) { return s.release(ctx, "F", store.Abandon) }},
		{"retired acquire", func(s *compatSide) (any, error) { return s.acquire(ctx, "F", "owner f", false) }},
		{"acquire to abandon", func(s *compatSide) (any, error) { return s.acquire(ctx, "G", "owner g", false) }},
		{"abandon of a held lock", func(s *compatSide) (any, error) { return s.release(ctx, "G", store.Abandon) }},
		{"node grant", func(s *compatSide) (any, error) { return s.grant(ctx, "H", "0", "owner h", "ab.H") }},
		{"node grant resent", func(s *compatSide) (any, error) { return s.grant(ctx, "H", "0", "owner h", "ab.H") }},
		{"node grant, busy, joins the line", func(s *compatSide) (any, error) { return s.grant(ctx, "I", "0", "owner i", "ab.I") }},
		{"node grant, busy, no line", func(s *compatSide) (any, error) { return s.grant(ctx, "J", "0", "owner j", "") }},
		{"node fence raised", func(s *compatSide) (any, error) { return s.setFence(ctx, "H", "6000000000000000") }},
		{"node fence of another", func(s *compatSide) (any, error) { return s.setFence(ctx, "I", "7000000000000000") }},
		{"node release names the next", func(s *compatSide) (any, error) { return s.nodeRelease(ctx, "H", store.Release, "ab.H") }},
		{"node abandon, not held", func(s *compatSide) (any, error) { return s.nodeRelease(ctx, "I", store.Abandon, "ab.I") }},
		{"node repair", func(s *compatSide) (any, error) { return s.grant(ctx, "K", "6500000000000000", "owner k", "") }},
		{"node abandon, held", func(s *compatSide) (any, error) { return s.nodeRelease(ctx, "K", store.Abandon, "") }},
		{"node grant, no counter: the clock", func(s *compatSide) (any, error) {
			if err := s.c.Del(ctx, s.keys[1]).Err(); err != nil {
				return nil, err
			}
			return s.grant(ctx, "L", "0", "owner l", "")
		}},
		{"node release, empty line", func(s *compatSide) (any, error) { return s.nodeRelease(ctx, "L", store.Release, "") }},
		{"node release, not held", func(s *compatSide) (any, error) { return s.nodeRelease(ctx, "M", store.Release, "") }},
		{"inspect at the end", func(s *compatSide) (any, error) { return s.inspect(ctx) }},
	}
	for _, step := range steps {
		var replies, dumps [2]any
		var msgs [2][]string
		for i, s := range sides {
			reply, err := step.do(s)
			if err != nil {
				reply = err
			}
			replies[i], dumps[i], msgs[i] = s.normal(reply), s.dump(ctx, t), heard[i]()
		}
		assert.Equal(t, replies[0], replies[1], "%s: replies (old, new)", step.name)
		assert.Equal(t, dumps[0], dumps[1], "%s: keys (old, new)", step.name)
		assert.Equal(t, append(msgs[0], more[step.name]...), msgs[1], "%s: messages (old, new)", step.name)
	}

	// One lock, taken and released in turn through the old and new scripts.
	old, cur := newCompatSide(t, c, true, name+".mixed"), newCompatSide(t, c, false, name+".mixed")
	var last int64
	for i, turn := range [][2]*compatSide{{old, cur}, {cur, old}, {old, cur}, {cur, old}} {
		holder, other := turn[0], turn[1]
		token := fmt.Sprint("T", i)
		reply, err := holder.acquire(ctx, token, "holder", false)
		require.NoError(t, err)
		ok, fence, _, err := decodeAcquire(reply)
		require.NoError(t, err)
		require.True(t, ok, "turn %d: acquire", i)
		assert.Greater(t, fence, last, "turn %d: fences increase", i)
		last = fence
		reply, err = other.acquire(ctx, token+"x", "other", false)
		require.NoError(t, err)
		ok, _, owner, err := decodeAcquire(reply)
		require.NoError(t, err)
		assert.False(t, ok, "turn %d: the other version's acquirer is excluded", i)
		assert.Equal(t, "holder", owner, "turn %d", i)
		reply, err = other.extend(ctx, token)
		require.NoError(t, err)
		assert.Equal(t, int64(1), reply, "turn %d: the other version extends the holder's lock", i)
		reply, err = other.release(ctx, token, store.Release)
		require.NoError(t, err)
		assert.Equal(t, int64(1), reply, "turn %d: the other version releases it", i)
		reply, err = holder.acquire(ctx, token, "holder", false)
		require.NoError(t, err)
		_, _, _, err = decodeAcquire(reply)
		assert.ErrorIs(t, err, store.ErrRetired, "turn %d: the released token is retired for both", i)
	}
}
