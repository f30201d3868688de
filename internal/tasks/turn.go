package tasks

import (
	"context"
	"sync"
)

// A Turn is a mutex whose Lock ends with a context: the calls on one lease
// reach Redis one at a time, in order. Its channel is made only when a
// call has to wait, so an uncontended lease allocates none. The zero Turn
// is free.
type Turn struct {
	mu   sync.Mutex
	held bool          // guarded by mu
	free chan struct{} // guarded by mu; closed at unlock when a call waits, nil otherwise
}

func (o *Turn) Lock(ctx context.Context) error {
	for {
		o.mu.Lock()
		if !o.held {
			o.held = true
			o.mu.Unlock()
			return nil
		}
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
	}
}

func (o *Turn) Unlock() {
	o.mu.Lock()
	o.held = false
	if o.free != nil {
		close(o.free)
		o.free = nil
	}
	o.mu.Unlock()
}
