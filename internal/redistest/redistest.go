// Package redistest starts real redis-server processes for tests: each on its
// own free loopback port, with nothing persisted, stopped by PID when the test
// ends (on Linux also when the test process dies without stopping them). Tests can kill, pause (SIGSTOP), resume and restart them, start
// replicas and clusters (cluster.go), and put a fault-injecting TCP proxy
// between a client and a server (proxy.go).
//
// When no redis-server is on PATH, Start skips the test with a clear message,
// unless FENCELOCK_REQUIRE_REDIS=1, which turns the skip into a failure.
package redistest

import (
	"context"
	"errors"
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
	bus  int // cluster bus port; 0 unless the server is a cluster node
	args []string
	// sentinel is the configuration of a Sentinel (without port, bind, dir
	// and logfile); "" for a redis-server.
	sentinel string
	cmd      *exec.Cmd
	exit     chan struct{} // closed when cmd has been waited for
}

// Start starts a redis-server on a free loopback port, with extra appended to
// its command line, and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, false, extra, "")
}

// start starts a server; a cluster node also gets a free port for its cluster
// bus, since the default (port+10000) can be taken or above 65535.
func start(t testing.TB, cluster bool, extra []string, sentinel string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_REDIS") == "1" {
			t.Fatalf("redistest: redis-server not on PATH and FENCELOCK_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("redistest: redis-server not on PATH; install it or set FENCELOCK_REQUIRE_REDIS=1 to fail instead of skipping")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: extra, sentinel: sentinel}
	var lastErr error
	for range 5 { // a free port can be taken between choosing and binding it
		s.port, err = freePort()
		if err == nil && cluster {
			s.bus, err = freePort()
		}
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
	if s.sentinel != "" {
		conf := filepath.Join(s.dir, "sentinel.conf") // rewritten by the Sentinel
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n%s\n",
			s.port, s.dir, filepath.Join(s.dir, "redis.log"), s.sentinel)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		return s.run([]string{conf, "--sentinel"})
	}
	args := append([]string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		// A master starts a full sync to a new replica at once, not after
		// waiting 5s for more replicas to share it.
		"--repl-diskless-sync-delay", "0",
	}, s.args...)
	if s.bus != 0 {
		// nodes.conf lives in s.dir, so a restarted node keeps its node ID
		// and its view of the cluster (but not its data).
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.bus))
	}
	return s.run(args)
}

// run starts the process with args and waits until it answers PING.
func (s *Server) run(args []string) error {
	cmd := exec.Command(s.bin, args...)
	dieWithTest(cmd)
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

// Restart kills the server and starts a new, empty one on the same port. A
// cluster node comes back with its node ID and its last view of the cluster.
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

// StartSentinel starts a Sentinel that monitors master under the name
// "fl" with the given quorum, judging a master down after 1s of silence,
// and waits until it knows the master's replicas (as many as the master
// reports). Start several, and use FailoverClient("fl", their addresses).
func StartSentinel(t testing.TB, master *Server, quorum int) *Server {
	t.Helper()
	conf := fmt.Sprintf("sentinel monitor fl 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds fl 1000\n"+
		"sentinel failover-timeout fl 2000\n", master.port, quorum)
	s := start(t, false, nil, conf)
	want := master.Info("replication")["connected_slaves"]
	eventually(t, 10*time.Second, func() error {
		v, err := s.Do("SENTINEL", "REPLICAS", "fl")
		if err != nil {
			return err
		}
		if got := strconv.Itoa(len(v.([]any))); got != want {
			return fmt.Errorf("the sentinel knows %s replicas, the master has %s", got, want)
		}
		return nil
	})
	return s
}

// StartReplica starts a server replicating master (--replicaof), with extra
// appended to its command line, and waits until the replica reports
// master_link_status:up and master lists it as online. It is stopped when
// the test ends; a Restart brings it back as a replica of master. master
// must not be a cluster node: a Cluster has its own replicas.
func StartReplica(t testing.TB, master *Server, extra ...string) *Server {
	t.Helper()
	host, port, _ := net.SplitHostPort(master.Addr)
	r := Start(t, append([]string{"--replicaof", host, port}, extra...)...)
	waitLinked(t, r, master)
	return r
}

// waitLinked waits until replica's link to master is up and master lists
// replica as online, so WAIT on master counts it.
func waitLinked(t testing.TB, replica, master *Server) {
	t.Helper()
	_, port, _ := net.SplitHostPort(replica.Addr)
	eventually(t, 10*time.Second, func() error {
		info, err := replica.info("replication")
		if err != nil {
			return err
		}
		if st := info["master_link_status"]; st != "up" {
			return fmt.Errorf("replica %s: master_link_status:%s", replica.Addr, st)
		}
		if info, err = master.info("replication"); err != nil {
			return err
		}
		for k, v := range info {
			if strings.HasPrefix(k, "slave") && strings.Contains(v, ",port="+port+",") &&
				strings.Contains(v, ",state=online,") {
				return nil
			}
		}
		return fmt.Errorf("master %s does not list replica %s as online", master.Addr, replica.Addr)
	})
	// A replica's acknowledgements count for WAIT only once the master has
	// had its first one (replicas send one a second): write, and wait until
	// this replica has acknowledged the write's offset.
	key := "redistest:replicas"
	for i := 0; ; i++ { // a cluster master takes only keys of its own slots
		_, err := master.Do("INCR", key)
		if err == nil {
			break
		}
		if !strings.HasPrefix(err.Error(), "MOVED") || i == 1000 {
			t.Fatalf("redistest: %s: %v", master.Addr, err)
		}
		key = "redistest:replicas:" + strconv.Itoa(i)
	}
	eventually(t, 10*time.Second, func() error {
		info, err := master.info("replication")
		if err != nil {
			return err
		}
		want := info["master_repl_offset"]
		for k, v := range info {
			if strings.HasPrefix(k, "slave") && strings.Contains(v, ",port="+port+",") {
				for _, f := range strings.Split(v, ",") {
					if off, ok := strings.CutPrefix(f, "offset="); ok && len(off) >= len(want) && off >= want {
						return nil
					}
				}
			}
		}
		return fmt.Errorf("replica %s has not acknowledged offset %s", replica.Addr, want)
	})
	master.mustDo("DEL", key)
}

// Do sends one command through a short-lived client and returns its reply
// (RESP2 shapes: string, int64, []any, nil for a nil reply). It gives up
// after 5 seconds, so it returns an error rather than hanging on a paused
// server, and it never retries.
func (s *Server) Do(args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// mustDo is Do that fails the test on an error.
func (s *Server) mustDo(args ...any) any {
	s.t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("redistest: %s: %v", s.Addr, err)
	}
	return v
}

// Info returns the fields of the server's INFO section (for example
// "replication"), failing the test if the server does not answer.
func (s *Server) Info(section string) map[string]string {
	s.t.Helper()
	info, err := s.info(section)
	if err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
	return info
}

func (s *Server) info(section string) (map[string]string, error) {
	v, err := s.Do("INFO", section)
	if err != nil {
		return nil, fmt.Errorf("INFO %s on %s: %w", section, s.Addr, err)
	}
	text, _ := v.(string)
	info := make(map[string]string)
	for line := range strings.Lines(text) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			info[k] = v
		}
	}
	return info, nil
}

// eventually polls cond every 10ms until it returns nil, and fails the test
// with cond's last error if that takes longer than d.
func eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: not within %v: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
