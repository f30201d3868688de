package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

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
// servers and checks what happened, not just that it ran.
func TestStory(t *testing.T) {
	setups := []demotest.Setup{demotest.Embedded, demotest.WithRedis, demotest.WithPostgres, demotest.WithRedisAndPostgres}
	demotest.Run(t, setups, func(t *testing.T, redisAddr, databaseURL string) {
		cfg := Config{RedisAddr: redisAddr, DatabaseURL: databaseURL, Out: demotest.Output(t)}
		cfg.Stderr = cfg.Out
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)
		checkStory(t, res)
		demotest.KeysGone(t, redisAddr, res.Keys)
		demotest.TablesGone(t, databaseURL, res.Table, res.Fences, res.Fences+"_keys")
	})
}

// checkStory checks the outcome of every firing and the settlements table.
func checkStory(t *testing.T, res Result) {
	t.Helper()
	require.Len(t, res.Firings, 5, "three firings at 00:05, a catch-up at 00:06, a late one at 00:07")

	// 00:05: one pod got the lock, was paused, and its write was rejected;
	// the two others skipped because the lock was busy.
	var stale Firing
	var busy []string
	for _, f := range res.Firings[:3] {
		assert.Equal(t, "00:05", f.At)
		if f.Pod == res.Paused {
			stale = f
			continue
		}
		assert.Equal(t, SkippedBusy, f.Outcome, "%s", f.Pod)
		assert.Zero(t, f.Fence, "%s did not get the lock", f.Pod)
		assert.False(t, f.Lost, "%s", f.Pod)
		busy = append(busy, f.Pod)
	}
	require.Len(t, busy, 2, "pods that skipped at 00:05")
	assert.Equal(t, Rejected, stale.Outcome, "the paused pod's write")
	assert.Positive(t, stale.Fence)
	assert.True(t, stale.Lost, "RunWithLock reported ErrLost to the paused pod: %s", stale.Err)
	assert.True(t, stale.Stale, "RunWithLock's error matches fencesql.ErrStale: %s", stale.Err)

	// 00:06: the catch-up run got a newer fence and settled the day.
	catchUp := res.Firings[3]
	assert.Equal(t, "00:06", catchUp.At)
	assert.Contains(t, busy, catchUp.Pod)
	assert.Equal(t, Settled, catchUp.Outcome)
	assert.Greater(t, catchUp.Fence, stale.Fence, "the catch-up run's fence is newer")
	assert.False(t, catchUp.Lost, catchUp.Err)
	assert.False(t, catchUp.Stale, catchUp.Err)

	// 00:07: the late run got the free lock, found the day done and skipped.
	late := res.Firings[4]
	assert.Equal(t, "00:07", late.At)
	assert.Contains(t, busy, late.Pod)
	assert.NotEqual(t, catchUp.Pod, late.Pod)
	assert.Equal(t, SkippedDone, late.Outcome)
	assert.Greater(t, late.Fence, catchUp.Fence, "the late run held the lock, with a newer fence")
	assert.False(t, late.Lost, late.Err)

	// Exactly one row, settled once, by the catch-up run, with its fence.
	want := []Row{{
		Date: res.Date, Status: "done", TotalCents: 19329,
		Fence: catchUp.Fence, SettledBy: catchUp.Pod,
	}}
	assert.Equal(t, want, res.Rows)
}

// TestFencedWrite checks the settlement's write on its own: it lands only
// with a fence at least the newest the guard recorded for the day (equal:
// the same lease writing again), a refused one changes nothing, and the
// seed does not reset a row.
func TestFencedWrite(t *testing.T) {
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, "")
	require.NoError(t, err)
	defer db.Close()
	q := newQueries(db, "settlements", "fences")
	_, err = db.ExecContext(ctx, q.create)
	require.NoError(t, err)
	g, err := db.NewGuard(ctx, "fences")
	require.NoError(t, err)

	const day = "2026-11-29"
	settle := func(fence int64, by string) error {
		t.Helper()
		_, err := db.ExecContext(ctx, q.seed, day)
		require.NoError(t, err)
		return settleTx(ctx, db, g, q, day, by, fence, 100*fence)
	}
	require.NoError(t, settle(20, "new"), "first write")
	var stale *fencesql.StaleError
	require.ErrorAs(t, settle(10, "stale"), &stale, "older fence")
	assert.Equal(t, fencesql.StaleError{Resource: "settlement:" + day, Fence: 10, Recorded: 20}, *stale)
	rows, err := q.rows(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, []Row{{Date: day, Status: "done", TotalCents: 2000, Fence: 20, SettledBy: "new"}}, rows,
		"the stale write changed nothing")
	require.NoError(t, settle(20, "same"), "same fence again")
	require.NoError(t, settle(30, "newer"), "newer fence")

	rows, err = q.rows(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, []Row{{Date: day, Status: "done", TotalCents: 3000, Fence: 30, SettledBy: "newer"}}, rows)
}

// TestCommand runs the command as `go run ./examples/settlement` does, on
// the embedded servers, and checks the timeline it prints.
func TestCommand(t *testing.T) {
	out := demotest.RunCommand(t)
	for _, want := range []string{
		`(?m)^ *\d+\.\d\ds  parent +00:05 the schedulers of pod-1, pod-2, pod-3 fire together$`,
		`(?m)^.* pod-\d +acquired the lock, fence \d+$`,
		`(?m)^.* pod-\d +lock busy, another pod is settling .*: skip \(fencelock: not obtained: "settlement:\S+" held by pod-\d \(pid \d+\) for \S+ more\)$`,
		`(?m)^.* pod-\d +ready-to-write fence=\d+$`,
		`(?m)^.* parent +(SIGSTOP|in-process pause of) pod-\d \(pid \d+\)`,
		`(?m)^.* pod-\d +write ACCEPTED with fence \d+`,
		`(?m)^.* pod-\d +write REJECTED with fence \d+: the row already has fence \d+ \(status done, by pod-\d\), so mine is stale$`,
		`(?m)^.* pod-\d +RunWithLock returned ErrLost: .*fencelock: lease lost`,
		`(?m)^.* pod-\d +\S+ is already settled \(status done, fence \d+, by pod-\d\): skip$`,
		`(?m)^.* parent +settled once: `,
	} {
		assert.Regexp(t, regexp.MustCompile(want), out)
	}
	assert.Equal(t, 2, strings.Count(out, "lock busy"), "two pods skipped at 00:05")
	assert.Equal(t, 1, strings.Count(out, "write ACCEPTED"))
	assert.Equal(t, 1, strings.Count(out, "write REJECTED"))
}

// TestCommandBadInput checks that a bad REDIS_ADDR or DATABASE_URL ends the
// command with a message saying what is wrong and exit code 1, not a panic.
func TestCommandBadInput(t *testing.T) {
	tests := []struct {
		env  string
		want string
	}{
		{"REDIS_ADDR=localhost", `REDIS_ADDR "localhost": want host:port or a redis:// URL`},
		{"REDIS_ADDR=redis://:secret@%zz", "REDIS_ADDR is not a valid redis:// URL"},
		{"REDIS_ADDR=127.0.0.1:1", "redis at 127.0.0.1:1 does not answer"},
		{"DATABASE_URL=mysql://root@127.0.0.1/test", "DATABASE_URL must be a postgres:// or postgresql:// URL"},
		{"DATABASE_URL=postgres://%zz:secret@127.0.0.1/test", "DATABASE_URL: cannot parse"},
		{"DATABASE_URL=postgres://postgres:secret@127.0.0.1:1/test?connect_timeout=2", "postgresql does not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			demotest.BadInput(t, "settlement", tt.env, tt.want)
		})
	}
}

// TestInterrupt interrupts the command while a pod is frozen and checks
// that no pod outlives it and its temporary database is gone.
func TestInterrupt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("finds leftover processes through /proc")
	}
	marker := "FENCELOCK_TEST_MARKER=" + demo.RunID()
	cmd := demotest.Command(t, marker)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	// Read up to the pause, then interrupt the command (not its pods).
	var out strings.Builder
	var dbPath string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		if m := regexp.MustCompile(`embedded SQLite (\S+),`).FindStringSubmatch(line); m != nil {
			dbPath = m[1]
		}
		if strings.Contains(line, "right before its write") {
			break
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT), "output so far:\n%s", out.String())
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output:\n%s", out.String())
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, stderr.String(), "interrupt")

	assert.Empty(t, processesWith(t, marker), "processes left behind")
	require.NotEmpty(t, dbPath, "output:\n%s", out.String())
	assert.NoDirExists(t, filepath.Dir(dbPath), "temporary database left behind")
}

// processesWith returns the PIDs of the processes whose environment holds
// kv.
func processesWith(t *testing.T, kv string) []string {
	t.Helper()
	environs, err := filepath.Glob("/proc/[0-9]*/environ")
	require.NoError(t, err)
	var pids []string
	for _, path := range environs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		if bytes.Contains(b, []byte(kv+"\x00")) {
			pids = append(pids, filepath.Base(filepath.Dir(path)))
		}
	}
	return pids
}
