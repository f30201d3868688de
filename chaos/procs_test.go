package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A proc is one child process: a redis-server, a Sentinel or a worker. It is
// stopped by PID (SIGCONT then SIGKILL) when the test ends, whatever the path.
type proc struct {
	name string

	mu     sync.Mutex
	cmd    *exec.Cmd     // guarded by mu; the current incarnation
	exited chan struct{} // guarded by mu; closed when cmd has been waited for
	out    *lockedBuffer // the child's stdout and stderr
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of exec's
// copying goroutines and the reads of a failing test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startProc starts argv with env added to the test's environment. The child
// is killed if the test process dies (Pdeathsig) and by t.Cleanup otherwise.
func startProc(t testing.TB, name string, env []string, argv ...string) (*proc, error) {
	p := &proc{name: name, out: &lockedBuffer{}}
	if err := p.start(env, argv); err != nil {
		return nil, err
	}
	t.Cleanup(p.kill)
	return p, nil
}

func (p *proc) start(env, argv []string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

func (p *proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// kill resumes the process if it is stopped, kills it with SIGKILL and waits
// for it to exit. It is safe to call more than once.
func (p *proc) kill() {
	cmd, exited := p.current()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// wait waits up to d for the process to exit by itself and reports whether it
// did.
func (p *proc) wait(d time.Duration) bool {
	_, exited := p.current()
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// exitCode returns the exit code of an exited process, or -1.
func (p *proc) exitCode() int {
	cmd, exited := p.current()
	select {
	case <-exited:
		return cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// pause stops the whole process with SIGSTOP and returns once the kernel
// reports it stopped, so that no thread of it (a watchdog included) runs on.
func (p *proc) pause() error {
	cmd, _ := p.current()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("%s: SIGSTOP: %w", p.name, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if procState(cmd.Process.Pid) == 'T' {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("%s: not stopped 2s after SIGSTOP", p.name)
}

// resume continues a paused process with SIGCONT.
func (p *proc) resume() error {
	cmd, _ := p.current()
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("%s: SIGCONT: %w", p.name, err)
	}
	return nil
}

// procState returns the state letter of /proc/pid/stat ('R', 'S', 'T', ...),
// or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// A redisNode is a redis-server, or a Sentinel, child on a fixed loopback
// port and data directory that survive restarts.
type redisNode struct {
	*proc
	t        testing.TB
	bin      string
	port     int
	addr     string // 127.0.0.1:port
	dir      string
	args     []string // extra arguments, or for a Sentinel the whole config
	sentinel bool
	admin    *redis.Client // the test's own connection, direct (no proxy)
}

// baseArgs is every data node's command line, unless a scenario says
// otherwise: loopback only, nothing persisted, replication without delay.
var baseArgs = []string{"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}

// startRedis starts a redis-server on a free loopback port with baseArgs and
// then extra (later arguments win), in a fresh directory.
func startRedis(t testing.TB, name string, extra ...string) *redisNode {
	t.Helper()
	n := newNode(t, name)
	n.args = append(append([]string{}, baseArgs...), extra...)
	n.boot()
	return n
}

// startSentinel starts a Sentinel whose configuration file is conf (without
// port, bind, dir and logfile, which it adds).
func startSentinel(t testing.TB, name, conf string) *redisNode {
	t.Helper()
	n := newNode(t, name)
	n.sentinel = true
	n.args = []string{conf}
	n.boot()
	return n
}

func newNode(t testing.TB, name string) *redisNode {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_REDIS") == "1" {
			t.Fatalf("chaos: redis-server not on PATH and FENCELOCK_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("chaos: redis-server not on PATH")
	}
	return &redisNode{t: t, bin: bin, dir: t.TempDir(), proc: &proc{name: name, out: &lockedBuffer{}}}
}

// boot picks a free port and starts the node on it.
func (n *redisNode) boot() {
	n.t.Helper()
	var err error
	for range 5 { // a free port can be taken between choosing and binding it
		if n.port, err = freePort(); err != nil {
			n.t.Fatalf("chaos: %v", err)
		}
		n.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
		if err = n.launch(); err == nil {
			n.admin = redis.NewClient(&redis.Options{
				Addr: n.addr, Protocol: 2, DisableIdentity: true,
				DialTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second,
				MaxRetries: 2, PoolSize: 4,
			})
			n.t.Cleanup(func() { _ = n.admin.Close() })
			n.t.Cleanup(n.kill)
			return
		}
	}
	n.t.Fatalf("chaos: %s: %v", n.name, err)
}

// launch starts the process on n.port and waits until it answers PING.
func (n *redisNode) launch() error {
	var argv []string
	if n.sentinel {
		conf := filepath.Join(n.dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n%s\n",
			n.port, n.dir, filepath.Join(n.dir, "sentinel.log"), n.args[0])
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		argv = []string{n.bin, conf, "--sentinel"}
	} else {
		argv = append([]string{n.bin,
			"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1",
			"--dir", n.dir, "--logfile", filepath.Join(n.dir, "redis.log"),
		}, n.args...)
	}
	if err := n.start(nil, argv); err != nil {
		return err
	}
	_, exited := n.current()
	c := redis.NewClient(&redis.Options{Addr: n.addr, Protocol: 2, DisableIdentity: true,
		MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%s on port %d exited at start: %s", n.name, n.port, n.log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.kill()
	return fmt.Errorf("%s on port %d did not answer PING within 10s", n.name, n.port)
}

// log returns the node's log file.
func (n *redisNode) log() string {
	name := "redis.log"
	if n.sentinel {
		name = "sentinel.log"
	}
	b, _ := os.ReadFile(filepath.Join(n.dir, name))
	return string(b)
}

// restart starts the node again on the same port, directory and arguments
// (it must have been killed). The port may linger briefly after a kill.
func (n *redisNode) restart() {
	n.t.Helper()
	var err error
	for range 50 {
		if err = n.launch(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.t.Fatalf("chaos: restart %s: %v", n.name, err)
}

// do runs one command on the node through the test's own connection.
func (n *redisNode) do(args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return n.admin.Do(ctx, args...).Result()
}

// info returns the fields of INFO section as a map.
func (n *redisNode) info(section string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := n.admin.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string)
	for line := range strings.SplitSeq(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// waitFor polls cond every 10ms until it returns nil or d has passed, and
// returns its last error.
func waitFor(d time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
