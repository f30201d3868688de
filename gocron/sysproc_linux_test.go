package fencegocron_test

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the child if the test process dies
// without cleaning up (SIGKILL, a crash); a child stopped with SIGSTOP would
// otherwise stay behind for ever.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
