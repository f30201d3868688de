// Package redistest starts real redis-server processes for tests: each on its
// own free loopback port, with nothing persisted, stopped by PID when the test
// ends. Tests can kill, pause (SIGSTOP), resume and restart them.
//
// When no redis-server is on PATH, Start skips the test with a clear message,
// unless FENCELOCK_REQUIRE_REDIS=1, which turns the skip into a failure.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server child process.
type Server struct {
	Addr string // 127.0.0.1:port

	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// Start starts a redis-server on a free loopback port, with extra appended to
// its command line, and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_REDIS") == "1" {
			t.Fatalf("redistest: redis-server not on PATH and FENCELOCK_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("redistest: redis-server not on PATH; install it or set FENCELOCK_REQUIRE_REDIS=1 to fail instead of skipping")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: extra}
	var lastErr error
	for range 5 { // a free port can be taken between choosing and binding it
		s.port, err = freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redistest: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	args := append([]string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, s.args...)
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	s.cmd, s.exit = cmd, exit

	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exit:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.port, log)
		default:
		}
		if s.ping() == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("redis-server on port %d did not answer PING within 10s", s.port)
}

func (s *Server) ping() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second, Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Client returns a new go-redis client for the server, closed when the test
// ends. opts may be nil; its Addr is overwritten.
func (s *Server) Client(opts *redis.Options) *redis.Client {
	var o redis.Options
	if opts != nil {
		o = *opts
	}
	o.Addr = s.Addr
	c := redis.NewClient(&o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Pid returns the process id of the running server.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Kill kills the server with SIGKILL (resuming it first if paused) and waits
// for it to exit. It is safe to call more than once.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	<-s.exit
}

// Pause stops the server's process with SIGSTOP: connections stay open and
// requests hang until Resume.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("redistest: SIGSTOP: %v", err)
	}
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("redistest: SIGCONT: %v", err)
	}
}

// Restart kills the server and starts a new, empty one on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// StartCluster starts a one-node Redis Cluster that serves all 16384 slots,
// so tests see the cluster's rules (a script's keys must share one slot).
func StartCluster(t testing.TB) *Server {
	t.Helper()
	s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redistest: cluster on %s not ok within 10s", s.Addr)
	return nil
}
