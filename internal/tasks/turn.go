package tasks

import (
	"context"
	"sync"
)

// A Turn is a mutex whose Lock ends with a context: the calls on one lease
// reach Redis one at a time, in order. The zero Turn is free, and an
// uncontended one allocates nothing.
type Turn struct {
	mu   sync.Mutex
	held bool          // guarded by mu
	free chan struct{} // guarded by mu; closed at unlock when a call waits, nil otherwise
}

// Lock takes the turn, or returns ctx.Err() without it once ctx ends.
func (o *Turn) Lock(ctx context.Context) error {
	o.mu.Lock()
	for o.held {
		if o.free == nil {
			o.free = make(chan struct{})
		}
		free := o.free
		o.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
		o.mu.Lock()
	}
	o.held = true
	o.mu.Unlock()
	return nil
}

// Unlock gives the turn back.
func (o *Turn) Unlock() {
	o.mu.Lock()
	o.held = false
	if o.free != nil {
		close(o.free)
		o.free = nil
	}
	o.mu.Unlock()
}
