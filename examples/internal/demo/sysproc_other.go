//go:build !linux

package demo

import "os/exec"

// setDeathSignal does nothing outside Linux, which alone has a parent-death
// signal. A child whose parent died reads end-of-file on stdin at its next
// command and exits; StopAll kills the children on every other path.
func setDeathSignal(*exec.Cmd) {}
