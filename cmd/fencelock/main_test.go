package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// raceEnabled is set by race_test.go: the command is then built with the
// race detector too.
var raceEnabled bool

// binary is the fencelock command, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencelock-cmd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "fencelock")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the command: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// How long the tests wait for what must happen (a command's exit, a
// watch's event, a waiter's lock): long enough that only a hang fails,
// not a slow run. On a busy 2-core machine a race-built command that
// returns at once took up to 19s, and a watch more than 10s to print its
// first line.
const patience = 2 * time.Minute

// heldTTL is the TTL of the locks the tests hold (newLocker's default) and
// how long startWaiter waits: the locks must still be held, and the
// waiters waiting, after the commands the test runs meanwhile, however
// slowly those run (30s locks expired between one command and the next).
// A Locker whose waiter must be woken, not poll, backs off as long: a
// lock it gets within patience came by the wake-up.
const heldTTL = 10 * time.Minute

// ttlBounds bounds what is left, when read now, of the TTL of a lock of
// heldTTL taken after before: at most heldTTL, at least heldTTL less the
// time since before (and 1ms, as PTTL counts whole milliseconds).
func ttlBounds(before time.Time) (lo, hi int64) {
	return (heldTTL - time.Since(before)).Milliseconds() - 1, heldTTL.Milliseconds()
}

// result is what one run of the command did.
type result struct {
	stdout, stderr string
	code           int
}

// fl runs the command with args, with REDIS_URL unset.
func fl(t *testing.T, args ...string) result {
	t.Helper()
	return flEnv(t, nil, args...)
}

// flEnv runs the command with args and the extra environment variables.
func flEnv(t *testing.T, extraEnv []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(environ(), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running fencelock %q: %v", args, err)
	}
	t.Logf("$ fencelock %s\n%s%s(exit %d)", strings.Join(args, " "), r.stdout, r.stderr, r.code)
	return r
}

// environ is the test's environment without REDIS_URL. A command built
// with the race detector would sleep 1s at exit (GORACE's
// atexit_sleep_ms); it does not.
func environ() []string {
	var env []string
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "REDIS_URL="):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = strings.TrimPrefix(kv, "GORACE=") + " " + gorace
		default:
			env = append(env, kv)
		}
	}
	return append(env, "GORACE="+gorace)
}

// want checks the exit code, and that stderr is empty on success and one
// line otherwise.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d; stdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	if lines := strings.Count(r.stderr, "\n"); lines > 1 || (lines == 1 && !strings.HasPrefix(r.stderr, "fencelock: ")) {
		t.Fatalf("stderr is not one line starting with \"fencelock: \":\n%s", r.stderr)
	}
	return r
}

// wantOut checks that stdout contains each of subs.
func (r result) wantOut(t *testing.T, subs ...string) result {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("stdout does not contain %q:\n%s", s, r.stdout)
		}
	}
	return r
}

// wantErr checks that stderr contains each of subs.
func (r result) wantErr(t *testing.T, subs ...string) result {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(r.stderr, s) {
			t.Fatalf("stderr does not contain %q:\n%s", s, r.stderr)
		}
	}
	return r
}

// jsonOut decodes stdout into v.
func (r result) jsonOut(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
}

func urlOf(s *redistest.Server) string { return "redis://" + s.Addr }

var ctx = context.Background()

// newLocker returns a Locker over client whose locks are owned by owner.
func newLocker(t *testing.T, client redis.UniversalClient, owner string, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	var o fencelock.Options
	if opts != nil {
		o = *opts
	}
	o.Owner = owner
	if o.TTL == 0 {
		o.TTL = heldTTL
	}
	l, err := fencelock.New(client, &o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func acquire(t *testing.T, l *fencelock.Locker, name string, opts ...fencelock.Option) *fencelock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, name, opts...)
	if err != nil {
		t.Fatalf("Acquire %q: %v", name, err)
	}
	return lease
}

// eventually polls cond every 10ms until it is true, for at most d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waiters returns how many wait for the lock called name.
func waiters(t *testing.T, l *fencelock.Locker, name string) int {
	t.Helper()
	info, err := l.Inspect(ctx, name)
	if err != nil {
		t.Fatalf("Inspect %q: %v", name, err)
	}
	return info.Waiters
}

// A waiter is an Acquire that waits in a goroutine of its own.
type waiter struct {
	cancel context.CancelFunc
	done   chan struct{}
	lease  *fencelock.Lease
	err    error
	took   time.Duration // from the start to the acquisition
}

// startWaiter starts an Acquire of name that waits up to heldTTL; stop it
// with result, or let the test's cleanup end it.
func startWaiter(t *testing.T, l *fencelock.Locker, name string, opts ...fencelock.Option) *waiter {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	w := &waiter{cancel: cancel, done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(w.done)
		w.lease, w.err = l.Acquire(wctx, name, append([]fencelock.Option{fencelock.WithWait(heldTTL)}, opts...)...)
		w.took = time.Since(start)
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// result waits at most d for the waiter's Acquire to return.
func (w *waiter) result(t *testing.T, d time.Duration) (*fencelock.Lease, error) {
	t.Helper()
	select {
	case <-w.done:
		return w.lease, w.err
	case <-time.After(d):
		t.Fatalf("the waiter did not get the lock within %v", d)
		return nil, nil
	}
}

// A watcher is fencelock watch --json running in the background.
type watcher struct {
	cmd    *exec.Cmd
	events chan map[string]any
	stderr *bytes.Buffer
	done   chan struct{} // closed when its output is read to the end
}

func startWatch(t *testing.T, args ...string) *watcher {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"watch", "--json"}, args...)...)
	cmd.Env = environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{cmd: cmd, events: make(chan map[string]any, 100), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		defer close(w.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				ev = map[string]any{"event": "not JSON: " + sc.Text()}
			}
			w.events <- ev
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-w.done
		_ = cmd.Wait()
	})
	return w
}

// next returns the next event, failing the test after patience.
func (w *watcher) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case ev, ok := <-w.events:
		if !ok {
			t.Fatalf("watch ended; stderr: %s", w.stderr)
		}
		t.Logf("watch: %v", ev)
		return ev
	case <-time.After(patience):
		t.Fatalf("no event from watch within %v", patience)
		return nil
	}
}

// expect checks that the next event is kind, with fence if not 0.
func (w *watcher) expect(t *testing.T, kind string, fence int64) map[string]any {
	t.Helper()
	ev := w.next(t)
	if ev["event"] != kind {
		t.Fatalf("event %v, want %s with fence %d", ev, kind, fence)
	}
	if fence != 0 && jsonInt(ev["fence"]) != fence {
		t.Fatalf("event %v, want fence %d", ev, fence)
	}
	return ev
}

// jsonInt converts a JSON number decoded into any; fences are exact below
// 2^53.
func jsonInt(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}
