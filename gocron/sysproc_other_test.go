//go:build !linux

package fencegocron_test

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death signal;
// t.Cleanup still kills the children.
func setDeathSignal(*exec.Cmd) {}
