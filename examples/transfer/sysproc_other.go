//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing outside Linux, which alone has a
// parent-death signal. A worker whose parent died before its go-ahead reads
// end-of-file on stdin and exits; stopAll kills the workers on every other
// path.
func setDeathSignal(*exec.Cmd) {}
