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

// TestFencedWrite checks the settlement's write on its own: it lands once;
// one with a fence older than the guard recorded for the day is refused
// (StaleError), one with the same or a newer fence finds the day settled
// (errSettled); neither changes anything, and the seed does not reset a
// row.
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
	want := []Row{{Date: day, Status: "done", TotalCents: 2000, Fence: 20, SettledBy: "new"}}
	require.NoError(t, settle(20, "new"), "first write")
	var stale *fencesql.StaleError
	require.ErrorAs(t, settle(10, "stale"), &stale, "older fence")
	assert.Equal(t, fencesql.StaleError{Resource: "settlement:" + day, Fence: 10, Recorded: 20}, *stale)
	require.ErrorIs(t, settle(20, "same"), errSettled, "same fence again")
	require.ErrorIs(t, settle(30, "newer"), errSettled, "newer fence")

	rows, err := q.rows(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, want, rows, "the writes after the first changed nothing")
}

// TestStaleHolder runs two settlements of a day in the test process, with
// the fences of two holders of its lock: a pod paused right before its write
// (beforeWrite) for longer than the TTL, whose lease has fence 1, and the pod
// that took the lock over meanwhile, whose lease has fence 2. Both found the
// day pending before the pause. Their writes run in both orders. Either way
// the day is settled exactly once; when the newer holder writes first, the
// stale one's write is refused with fencesql.ErrStale.
func TestStaleHolder(t *testing.T) {
	const day = "2026-11-29"
	demotest.Run(t, []demotest.Setup{demotest.Embedded, demotest.WithPostgres}, func(t *testing.T, _, databaseURL string) {
		t.Run("stale writes first", func(t *testing.T) {
			st := newStaleSetup(t, databaseURL, day)
			staleDone := st.pausedSettle(t, st.stale, 1)
			newerDone := st.pausedSettle(t, st.newer, 2)
			// Both found the day pending. The stale pod's transaction runs
			// first: the database knows of no newer fence yet, so it lands.
			close(st.release[st.stale])
			s := <-staleDone
			require.NoError(t, s.err)
			assert.Equal(t, Settled, s.f.Outcome, "the stale pod, first to write")
			close(st.release[st.newer])
			n := <-newerDone
			require.NoError(t, n.err)
			assert.Equal(t, SkippedDone, n.f.Outcome, "the newer pod, second: the day was settled meanwhile")
			st.checkRows(t, Row{Date: day, Status: "done", TotalCents: 19329, Fence: 1, SettledBy: "stale"})
		})
		t.Run("newer writes first", func(t *testing.T) {
			st := newStaleSetup(t, databaseURL, day)
			staleDone := st.pausedSettle(t, st.stale, 1)
			close(st.release[st.newer])
			n := <-st.settle(t, st.newer, 2)
			require.NoError(t, n.err)
			assert.Equal(t, Settled, n.f.Outcome, "the newer pod, first to write")
			close(st.release[st.stale])
			s := <-staleDone
			var refused *fencesql.StaleError
			require.ErrorAs(t, s.err, &refused, "the stale pod's write")
			assert.Equal(t, fencesql.StaleError{Resource: "settlement:" + day, Fence: 1, Recorded: 2}, *refused)
			assert.Equal(t, Rejected, s.f.Outcome, "the stale pod, second")
			st.checkRows(t, Row{Date: day, Status: "done", TotalCents: 19329, Fence: 2, SettledBy: "newer"})
		})
	})
}

// staleSetup is a run's tables and the two pods of TestStaleHolder.
type staleSetup struct {
	db           *demo.DB
	q            queries
	stale, newer *pod
	reached      map[*pod]chan struct{} // closed by the pod's beforeWrite
	release      map[*pod]chan struct{} // closed by the test to let it go on
}

func newStaleSetup(t *testing.T, databaseURL, day string) *staleSetup {
	t.Helper()
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, databaseURL)
	require.NoError(t, err)
	id := demo.RunID()
	table, fences := "settlements_"+id, "fences_"+id
	st := &staleSetup{db: db, q: newQueries(db, table, fences),
		reached: map[*pod]chan struct{}{}, release: map[*pod]chan struct{}{}}
	t.Cleanup(func() {
		assert.NoError(t, db.DropTables(ctx, table, fences, fences+"_keys"))
		assert.NoError(t, db.Close())
	})
	_, err = db.ExecContext(ctx, st.q.create)
	require.NoError(t, err)
	guard, err := db.NewGuard(ctx, fences)
	require.NoError(t, err)
	out := demotest.Output(t)
	newPod := func(name string) *pod {
		p := &pod{cfg: podConfig{Pod: name, Date: day}, parent: demo.NewParent[Firing](name, strings.NewReader(""), out),
			db: db, q: st.q, guard: guard}
		reached, release := make(chan struct{}), make(chan struct{})
		st.reached[p], st.release[p] = reached, release
		p.beforeWrite = func() {
			close(reached)
			<-release
		}
		return p
	}
	st.stale, st.newer = newPod("stale"), newPod("newer")
	return st
}

// settled is what a pod's settle returned.
type settled struct {
	f   Firing
	err error
}

// settle runs p's settle of the day with fence on a goroutine of its own,
// and returns where it sends what settle returned.
func (st *staleSetup) settle(t *testing.T, p *pod, fence int64) <-chan settled {
	ctx := t.Context()
	done := make(chan settled, 1)
	go func() {
		f := Firing{Pod: p.cfg.Pod, Fence: fence}
		err := p.settle(ctx, fence, &f)
		done <- settled{f, err}
	}()
	return done
}

// pausedSettle starts p's settle, as settle does, and returns once it has
// reached beforeWrite, where it waits for st.release[p].
func (st *staleSetup) pausedSettle(t *testing.T, p *pod, fence int64) <-chan settled {
	t.Helper()
	done := st.settle(t, p, fence)
	select {
	case <-st.reached[p]:
		return done
	case s := <-done:
		require.FailNow(t, "the settlement ended before its write", "%s: %+v, %v", p.cfg.Pod, s.f, s.err)
		return nil
	}
}

// checkRows checks that the settlements table holds want alone.
func (st *staleSetup) checkRows(t *testing.T, want Row) {
	t.Helper()
	rows, err := st.q.rows(t.Context(), st.db)
	require.NoError(t, err)
	assert.Equal(t, []Row{want}, rows)
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
