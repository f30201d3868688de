package demo

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the child if the parent dies without
// reaching StopAll (SIGKILL, a crash). Without it a child frozen by SIGSTOP
// would stay behind, stopped, for ever.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
