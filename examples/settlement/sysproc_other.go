//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing outside Linux, which alone has a parent-death
// signal. A pod whose parent died reads end-of-file on stdin at its next
// command and exits; stopAll kills the pods on every other path.
func setDeathSignal(*exec.Cmd) {}
