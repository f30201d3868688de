package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the worker if the parent dies
// without reaching stopAll (SIGKILL, a crash).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
