package redistest_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/redistest"
)

// orphanEnv makes TestServerDiesWithItsTestProcess's own run a helper that
// starts a server, paused, and waits to be killed.
const orphanEnv = "REDISTEST_ORPHAN_HELPER"

// A test process that dies without its clean-ups (killed, or a test
// timeout's panic) takes its servers with it, paused ones too: they would
// otherwise stay behind for ever, holding their ports.
func TestServerDiesWithItsTestProcess(t *testing.T) {
	if os.Getenv(orphanEnv) == "1" {
		s := redistest.Start(t)
		s.Pause()
		fmt.Printf("server %s %d\n", s.Addr, s.Pid())
		time.Sleep(time.Minute) // killed before
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("only Linux kills a child with its parent")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		redistest.Start(t) // skips, or fails with FENCELOCK_REQUIRE_REDIS=1
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(self, "-test.run=^TestServerDiesWithItsTestProcess$", "-test.count=1", "-test.v")
	helper.Env = append(os.Environ(), orphanEnv+"=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	var pid int
	for sc := bufio.NewScanner(out); sc.Scan(); {
		if _, err := fmt.Sscanf(sc.Text(), "server %s %d", &addr, &pid); err == nil {
			break
		}
	}
	_ = helper.Process.Kill()
	_ = helper.Wait()
	if addr == "" {
		t.Fatal("the helper did not report its server")
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		switch {
		case err == nil:
			c.Close()
		case errors.Is(err, syscall.ECONNREFUSED):
			return // gone
		case errors.Is(err, syscall.ECONNRESET):
			// The listener closed while this dial sat in its backlog: the
			// server is going; the next dial tells.
		default:
			t.Fatalf("dial the orphan's address: %v", err)
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // this test's own clean-up
			t.Fatalf("the server of a killed test process (pid %d) still listens on %s 5s later", pid, addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
