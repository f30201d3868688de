//go:build unix

package main

import (
	"os"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// pauseMethod and resumeMethod name, for the timeline, how the parent
// pauses and resumes a pod.
const (
	pauseMethod  = "SIGSTOP"
	resumeMethod = "SIGCONT"
)

// pausePod freezes every thread of the pod process at once, as a long
// garbage-collection pause, a suspended VM or a stalled disk would: its
// watchdog cannot renew the lock and none of its timers fire until resumePod.
func pausePod(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

// resumePod lets a paused pod run again from where it stopped.
func resumePod(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// selfPause does nothing on Unix, where the parent freezes the whole pod with
// SIGSTOP. See pause_other.go for the platforms without SIGSTOP.
type selfPause struct{}

func newSelfPause(*redis.Client) selfPause { return selfPause{} }

func (selfPause) start() {}
func (selfPause) end()   {}
