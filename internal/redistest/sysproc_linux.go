package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel kill the server when the test process dies
// without stopping it (killed, or a test timeout's panic, which runs no
// clean-up); a paused server would otherwise stay behind for ever, holding
// its port. The signal comes when the thread that started the server ends,
// which in Go is the process ending (or a goroutine locked to its thread
// returning without unlocking: start servers from ordinary goroutines).
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
