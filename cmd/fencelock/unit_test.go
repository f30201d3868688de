package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
)

// These tests run in the test process: pure logic, no Redis.

func TestTracker(t *testing.T) {
	t.Parallel()
	type read struct {
		msgs  []bool // release messages before the read: forced or not
		at    int    // milliseconds since the start
		held  bool
		fence int64
		ttl   int // milliseconds; -1: no expiry
		last  int64
		want  []string // the events: "kind fence [from F] [forced] [unseen]"
	}
	held := func(at int, fence int64, ttl int, want ...string) read {
		return read{at: at, held: true, fence: fence, ttl: ttl, last: fence, want: want}
	}
	free := func(at int, last int64, want ...string) read {
		return read{at: at, last: last, want: want}
	}
	msg := func(r read, forced ...bool) read {
		r.msgs = forced
		return r
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"grant and release", []read{
			free(0, 0, "free 0"),
			held(50, 10, 1000, "grant 10"),
			held(100, 10, 950),
			msg(free(120, 10, "release 10"), false),
			free(170, 10),
		}},
		{"held at the start, then expiry", []read{
			held(0, 10, 100, "held 10"),
			held(50, 10, 50),
			free(100, 10),              // gone at its deadline: wait for a late message
			free(150, 10),              // still within the grace
			free(200, 10, "expiry 10"), // no message came
		}},
		{"deleted before its TTL without a message", []read{
			held(0, 10, 1000, "held 10"),
			free(50, 10),
			free(150, 10, "release 10"),
		}},
		{"a late message makes it a release", []read{
			held(0, 10, 100, "held 10"),
			free(100, 10),
			msg(free(120, 10, "release 10"), false),
		}},
		{"a renewal moves the deadline", []read{
			held(0, 10, 100, "held 10"),
			held(90, 10, 100),
			free(150, 10),
			free(250, 10, "release 10"), // gone at 150, before 190
		}},
		{"hand-off at the read of the release", []read{
			held(0, 10, 1000, "held 10"),
			msg(held(50, 11, 1000, "release 10", "hand-off 11 from 10"), false),
		}},
		{"hand-off within the window, grant after it", []read{
			held(0, 10, 1000, "held 10"),
			msg(free(50, 10, "release 10"), false),
			held(300, 11, 1000, "hand-off 11 from 10"),
			msg(free(400, 11, "release 11"), false),
			held(800, 12, 1000, "grant 12"),
		}},
		{"an expiry is not handed off", []read{
			held(0, 10, 50, "held 10"),
			free(60, 10),
			held(170, 11, 1000, "expiry 10", "grant 11"),
		}},
		{"forced release", []read{
			held(0, 10, 1000, "held 10"),
			msg(free(50, 10, "release 10 forced"), true),
		}},
		{"a holding granted and released between two reads", []read{
			free(0, 9, "free 9"),
			msg(free(50, 10, "grant 10 unseen", "release 10 unseen"), false),
			free(100, 10),
		}},
		{"a holding granted and released between two reads, then a grant", []read{
			held(0, 9, 1000, "held 9"),
			msg(free(50, 10, "release 9", "hand-off 10 from 9 unseen", "release 10 unseen"), false, false),
		}},
		{"a message no holding explains is dropped", []read{
			held(0, 10, 100, "held 10"),
			msg(held(20, 10, 80), false),
			free(100, 10),
			free(200, 10, "expiry 10"),
		}},
		{"an expiry read in its last millisecond", []read{
			held(0, 10, 50, "held 10"),
			held(50, 10, 0), // PTTL 0: the key is still there
			free(60, 10),
			free(160, 10, "expiry 10"),
		}},
		{"no expiry", []read{
			held(0, 10, -1, "held 10"),
			free(5000, 10),
			free(5100, 10, "release 10"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := &tracker{handoff: 300 * time.Millisecond, grace: 100 * time.Millisecond}
			t0 := time.Now()
			for i, r := range tc.reads {
				for _, forced := range r.msgs {
					tr.message(forced)
				}
				at := t0.Add(time.Duration(r.at) * time.Millisecond)
				ttl := time.Duration(r.ttl) * time.Millisecond
				if r.ttl < 0 {
					ttl = -1
				}
				info := fencelock.LockInfo{Held: r.held, Fence: r.fence, TTL: ttl, LastFence: r.last}
				if !r.held {
					info.Fence, info.TTL = 0, 0
				}
				var got []string
				for _, ev := range tr.observe(at, at, info) {
					got = append(got, describe(ev))
				}
				if !slices.Equal(got, r.want) {
					t.Fatalf("read %d (at %dms): got events %q, want %q", i, r.at, got, r.want)
				}
			}
		})
	}
}

func describe(ev event) string {
	s := fmt.Sprintf("%s %d", ev.Kind, ev.Fence)
	if ev.Kind == evFree {
		s = fmt.Sprintf("free %d", ev.LastFence)
	}
	if ev.Kind == evHandoff {
		s += fmt.Sprintf(" from %d", ev.From)
	}
	if ev.Forced {
		s += " forced"
	}
	if ev.Unseen {
		s += " unseen"
	}
	return s
}

// TestHoldersTracker: a semaphore's permits, read by Semaphore.Inspect,
// become taken, freed and expired events, each with the permits held
// after it.
func TestHoldersTracker(t *testing.T) {
	t.Parallel()
	type read struct {
		msgs    []bool // messages before the read: forced or not
		at      int    // milliseconds since the start
		holders []heldBy
		last    int64
		want    []string // the events: "kind fence held/permits [forced] [unseen]"
	}
	// p is a permit: its token is "t<fence>", ttl in milliseconds (-1: no
	// expiry).
	p := func(fence int64, ttl int) heldBy {
		d := time.Duration(ttl) * time.Millisecond
		if ttl < 0 {
			d = -1
		}
		return heldBy{id: fmt.Sprintf("t%d", fence), token: fmt.Sprintf("t%d", fence), fence: fence, ttl: d}
	}
	r := func(at int, last int64, holders []heldBy, want ...string) read {
		return read{at: at, last: last, holders: holders, want: want}
	}
	msg := func(r read, forced ...bool) read {
		r.msgs = forced
		return r
	}
	hs := func(h ...heldBy) []heldBy { return h }
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"held at the start, taken, freed", []read{
			r(0, 11, hs(p(10, 1000), p(11, 1000)), "holding 10 2/3", "holding 11 2/3"),
			r(50, 12, hs(p(10, 950), p(11, 950), p(12, 1000)), "taken 12 3/3"),
			r(100, 12, hs(p(11, 900), p(12, 950))), // 10 gone before its TTL: wait for a message
			r(200, 13, hs(p(11, 800), p(12, 850), p(13, 1000)), "freed 10 2/3", "taken 13 3/3"),
		}},
		{"nothing held at the start", []read{
			r(0, 0, nil),
			r(50, 10, hs(p(10, 1000)), "taken 10 1/3"),
		}},
		{"expired", []read{
			r(0, 10, hs(p(10, 100)), "holding 10 1/3"),
			r(100, 10, nil),
			r(150, 10, nil),
			r(200, 10, nil, "expired 10 0/3"),
		}},
		{"a renewal moves the deadline", []read{
			r(0, 10, hs(p(10, 100)), "holding 10 1/3"),
			r(90, 10, hs(p(10, 100))),
			r(150, 10, nil),
			r(250, 10, nil, "freed 10 0/3"), // gone at 150, before 190
		}},
		{"forced, by a message", []read{
			r(0, 11, hs(p(10, 1000), p(11, 1000)), "holding 10 2/3", "holding 11 2/3"),
			msg(r(50, 11, hs(p(10, 950)), "freed 11 1/3 forced"), true),
			r(60, 11, hs(p(10, 940))),
		}},
		{"forced, the message late", []read{
			r(0, 10, hs(p(10, 1000)), "holding 10 1/3"),
			r(50, 10, nil),
			msg(r(70, 10, nil, "freed 10 0/3 forced"), true),
		}},
		{"any message decides at once", []read{
			r(0, 11, hs(p(10, 1000), p(11, 1000)), "holding 10 2/3", "holding 11 2/3"),
			msg(r(50, 12, hs(p(11, 950), p(12, 1000)), "freed 10 1/3", "taken 12 2/3"), false),
		}},
		{"taken and freed between two reads", []read{
			r(0, 10, hs(p(10, 1000)), "holding 10 1/3"),
			r(50, 11, hs(p(10, 950)), "taken 11 2/3 unseen", "freed 11 1/3 unseen"),
			r(100, 11, hs(p(10, 900))),
		}},
		{"no expiry", []read{
			r(0, 10, hs(p(10, -1)), "holding 10 1/3"),
			r(5000, 10, nil),
			r(5100, 10, nil, "freed 10 0/3"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newHoldersTracker(kindSemaphore, 100*time.Millisecond)
			t0 := time.Now()
			for i, rd := range tc.reads {
				for _, forced := range rd.msgs {
					tr.message(forced)
				}
				at := t0.Add(time.Duration(rd.at) * time.Millisecond)
				hr := holdersRead{holders: rd.holders, lastFence: rd.last}
				if len(rd.holders) > 0 {
					hr.permits = 3
				}
				var got []string
				for _, ev := range tr.observe(at, at, hr) {
					d := fmt.Sprintf("%s %d %d/%d", ev.Kind, ev.Fence, ev.Held, ev.Permits)
					if ev.Forced {
						d += " forced"
					}
					if ev.Unseen {
						d += " unseen"
					}
					got = append(got, d)
				}
				if !slices.Equal(got, rd.want) {
					t.Fatalf("read %d (at %dms): got events %q, want %q", i, rd.at, got, rd.want)
				}
			}
		})
	}
}

func TestParseFlagsAnywhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args      []string
		wantPos   []string
		wantForce bool
		wantURL   string
	}{
		{[]string{"--url", "redis://h:1", "--force", "NAME"}, []string{"NAME"}, true, "redis://h:1"},
		{[]string{"--force", "NAME", "--url", "redis://h:1"}, []string{"NAME"}, true, "redis://h:1"},
		{[]string{"NAME", "--force"}, []string{"NAME"}, true, ""},
		{[]string{"-force", "-url=redis://h:1", "NAME"}, []string{"NAME"}, true, "redis://h:1"},
		{[]string{"--force", "--", "-NAME", "--url"}, []string{"-NAME", "--url"}, true, ""},
		{[]string{"A", "B"}, []string{"A", "B"}, false, ""},
		{nil, nil, false, ""},
	} {
		var cf connFlags
		fs := newFlagSet("release", &cf)
		force := fs.Bool("force", false, "")
		e := &env{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
		pos, err := parse(e, releaseCommand, fs, tc.args)
		if err != nil {
			t.Errorf("parse(%q): %v", tc.args, err)
			continue
		}
		if !slices.Equal(pos, tc.wantPos) || *force != tc.wantForce || cf.url != tc.wantURL {
			t.Errorf("parse(%q): got args %q, --force %v, --url %q; want %q, %v, %q",
				tc.args, pos, *force, cf.url, tc.wantPos, tc.wantForce, tc.wantURL)
		}
	}
}

func TestParseFlagErrors(t *testing.T) {
	t.Parallel()
	var cf connFlags
	fs := newFlagSet("ls", &cf)
	e := &env{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	_, err := parse(e, lsCommand, fs, []string{"--db", "x"})
	if ce, ok := err.(*cmdError); !ok || ce.code != exitUsage {
		t.Fatalf("--db x: got %v, want a usage error", err)
	}
	fs = newFlagSet("ls", &cf)
	_, err = parse(e, lsCommand, fs, []string{"--help"})
	if ce, ok := err.(*cmdError); !ok || ce.code != exitOK {
		t.Fatalf("--help: got %v, want exit 0", err)
	}
	if !strings.Contains(e.stdout.(*bytes.Buffer).String(), "Usage: fencelock ls") {
		t.Fatalf("--help printed %q", e.stdout)
	}
}

func TestNameOf(t *testing.T) {
	t.Parallel()
	s := &session{prefix: "lock:"}
	for key, want := range map[string]string{
		"lock:{a}":           "a",
		"lock:{order:42}":    "order:42",
		"lock:{a}:fence":     "",
		"lock:{a}:t:1234":    "",
		"lock:{a}:q":         "",
		"lock:{a}:qi":        "",
		"lock:{}":            "",
		"lock:{a}}":          "",
		"other:{a}":          "",
		"lock:a":             "",
		"lock:{a{b}":         "",
		"lock:{settle:*?[]}": "settle:*?[]",
	} {
		got, ok := s.nameOf(key)
		if got != want || ok != (want != "") {
			t.Errorf("nameOf(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

func TestTableOnTerminal(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	printTable(&b, []fencelock.LockInfo{
		{Name: "settlement:2026-11-29", Held: true, Owner: "pod-2 (pid 7)", TTL: 2400 * time.Millisecond, Fence: 1764525481123456, Waiters: 1},
		{Name: "x", Held: true, Owner: "", TTL: -1, Fence: 7},
	}, "lock:{*}")
	want := `NAME                   OWNER          TTL        FENCE             WAITERS
settlement:2026-11-29  pod-2 (pid 7)  2.4s       1764525481123456  1
x                      -              no expiry  7                 0
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printTable(&b, nil, "lock:{job:*}")
	if got := b.String(); got != "no lock held matching lock:{job:*}\n" {
		t.Errorf("empty table: %q", got)
	}
}

func TestFormatEvent(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 15, 4, 5, 123e6, time.Local)
	for _, tc := range []struct {
		ev   event
		want string
	}{
		{event{Kind: evGrant, At: at, Fence: 17, Owner: "pod-2 (pid 7)", TTL: 30 * time.Second},
			`15:04:05.123 grant fence=17 owner="pod-2 (pid 7)" ttl=30s`},
		{event{Kind: evHandoff, At: at, Fence: 18, Owner: "b", TTL: time.Second, From: 17},
			`15:04:05.123 hand-off fence=18 owner="b" ttl=1s from_fence=17`},
		{event{Kind: evRelease, At: at, Fence: 18, Owner: "b", Forced: true},
			`15:04:05.123 release fence=18 owner="b" forced`},
		{event{Kind: evGrant, At: at, Fence: 19, Unseen: true},
			`15:04:05.123 grant fence=19 unseen`},
		{event{Kind: evFree, At: at, LastFence: 19},
			`15:04:05.123 free last_fence=19`},
		{event{Kind: evExpiry, At: at, Fence: 19, Owner: ""},
			`15:04:05.123 expiry fence=19 owner=""`},
		{event{Kind: evTaken, At: at, Fence: 20, Owner: "c", TTL: 30 * time.Second, Of: kindSemaphore, Token: "ab12", Held: 3, Permits: 3},
			`15:04:05.123 taken kind=semaphore permits=3/3 fence=20 owner="c" ttl=30s token=ab12`},
		{event{Kind: evFreed, At: at, Fence: 20, Owner: "c", Of: kindSemaphore, Token: "ab12", Held: 2, Permits: 3, Forced: true},
			`15:04:05.123 freed kind=semaphore permits=2/3 fence=20 owner="c" token=ab12 forced`},
		{event{Kind: evExpired, At: at, Fence: 21, Owner: "d", Of: kindRWLock, Mode: "shared"},
			`15:04:05.123 expired kind=rwlock mode=shared fence=21 owner="d"`},
	} {
		if got := formatEvent(tc.ev); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

func TestFmtTTL(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-1:                       "no expiry",
		0:                        "0s",
		275 * time.Millisecond:   "275ms",
		999 * time.Millisecond:   "999ms",
		27237 * time.Millisecond: "27.2s",
		30 * time.Second:         "30s",
		90 * time.Minute:         "1h30m0s",
	} {
		if got := fmtTTL(d); got != want {
			t.Errorf("fmtTTL(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestWrap(t *testing.T) {
	t.Parallel()
	got := wrap("aaa bbb ccc ddd", "  ", 7)
	if want := "aaa bbb\n  ccc ddd"; got != want {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}

// TestReadmeJSONFlags: the CLI's documentation (docs/operating.md, where
// the README's CLI section went) names the commands that have --json, and
// exactly those accept it (issue 28: it said every command has --json, and
// release refuses it).
func TestReadmeJSONFlags(t *testing.T) {
	readme, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("((?:`[a-z]+`(?:, | and ))*`[a-z]+`) (?:has|have) `--json`").FindSubmatch(readme)
	if m == nil {
		t.Fatalf("docs/operating.md names no command with --json: want a sentence \"`ls`, ... and `doctor` have `--json`\"")
	}
	named := map[string]bool{}
	for _, n := range regexp.MustCompile("`([a-z]+)`").FindAllSubmatch(m[1], -1) {
		named[string(n[1])] = true
	}
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		code := run(context.Background(), []string{c.name, "--json", "-h"}, e)
		if accepts := code == exitOK; accepts != named[c.name] {
			t.Errorf("%s --json -h: exit %d (stderr %q); docs/operating.md names it with --json: %v",
				c.name, code, stderr.String(), named[c.name])
		}
	}
}
