//go:build !unix

package main

import (
	"context"
	"net"
	"os"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Without SIGSTOP (Windows), a process cannot be frozen from outside with
// the standard library, so the held pod pauses itself: while paused, every
// Redis call it makes blocks, so its watchdog cannot renew the lock, exactly
// as if the process were frozen. One difference from a real freeze: the
// pod's timers keep running, so its watchdog sees the lease's deadline pass
// and cancels the work's context during the pause instead of right after
// it. The stale write is then sent and rejected all the same.

// pauseMethod and resumeMethod name, for the timeline, how the pod is
// paused and resumed.
const (
	pauseMethod  = "in-process pause of"
	resumeMethod = "end of the in-process pause of"
)

// pausePod does nothing here: the pod pauses itself at the hold point.
func pausePod(*os.Process) error { return nil }

// resumePod does nothing here: the pod resumes itself when told to write.
func resumePod(*os.Process) error { return nil }

// selfPause blocks the pod's Redis calls between start and end.
type selfPause struct {
	*pauseHook
}

func newSelfPause(c *redis.Client) selfPause {
	h := &pauseHook{}
	c.AddHook(h)
	return selfPause{h}
}

// pauseHook is a go-redis hook that holds every command while paused.
type pauseHook struct {
	mu      sync.Mutex
	resumed chan struct{} // guarded by mu; nil when not paused, closed by end
}

var _ redis.Hook = (*pauseHook)(nil)

func (h *pauseHook) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resumed = make(chan struct{})
}

func (h *pauseHook) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resumed != nil {
		close(h.resumed)
		h.resumed = nil
	}
}

// hold blocks while the pod is paused, or until ctx ends.
func (h *pauseHook) hold(ctx context.Context) error {
	h.mu.Lock()
	resumed := h.resumed
	h.mu.Unlock()
	if resumed == nil {
		return nil
	}
	select {
	case <-resumed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *pauseHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := h.hold(ctx); err != nil {
			return nil, err
		}
		return next(ctx, network, addr)
	}
}

func (h *pauseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.hold(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *pauseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.hold(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}
