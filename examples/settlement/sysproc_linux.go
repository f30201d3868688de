package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the pod if the parent dies without
// reaching stopAll (SIGKILL, a crash). Without it a pod frozen by SIGSTOP
// would stay behind, stopped, for ever.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
