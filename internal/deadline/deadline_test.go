package deadline

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWithTimeoutEndsAtTheDeadline: the contexts of the heap
// end at their deadline, earliest first, whatever the order they were made
// in; one cancelled first ends as cancelled; a cancellable parent gets
// context.WithTimeout.
func TestWithTimeoutEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	var l Heap
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	start := time.Now()
	late, cancelLate := l.WithTimeout(parent, 200*time.Millisecond)
	defer cancelLate()
	beforeEarly := time.Now()
	early, cancelEarly := l.WithTimeout(parent, 50*time.Millisecond)
	afterEarly := time.Now()
	defer cancelEarly()
	gone, cancelGone := l.WithTimeout(parent, 100*time.Millisecond)

	assert.Equal(t, "v", late.Value(key{}), "the parent's values")
	d, ok := early.Deadline()
	require.True(t, ok)
	assert.False(t, d.Before(beforeEarly.Add(50*time.Millisecond)) || d.After(afterEarly.Add(50*time.Millisecond)),
		"deadline %v, want 50ms after the call", d.Sub(beforeEarly))
	assert.NoError(t, early.Err())

	cancelGone()
	<-gone.Done()
	assert.ErrorIs(t, gone.Err(), context.Canceled)

	<-early.Done()
	assert.ErrorIs(t, early.Err(), context.DeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	assert.NoError(t, late.Err(), "the later one runs on")
	<-late.Done()
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	assert.ErrorIs(t, late.Err(), context.DeadlineExceeded)
	cancelLate() // after the end: nothing
	assert.ErrorIs(t, late.Err(), context.DeadlineExceeded)

	l.mu.Lock()
	assert.Empty(t, l.due, "every context is out")
	l.mu.Unlock()

	cctx, cancel := context.WithCancel(parent)
	child, cancelChild := l.WithTimeout(cctx, time.Minute)
	defer cancelChild()
	_, isBound := child.(*boundCtx)
	assert.False(t, isBound, "a cancellable parent's cancellation must reach the child")
	cancel()
	<-child.Done()
}

// TestWithTimeoutManyAtOnce: contexts made and cancelled from many
// goroutines leave none behind, and those left to expire all end.
func TestWithTimeoutManyAtOnce(t *testing.T) {
	t.Parallel()
	var l Heap
	done := make(chan struct{})
	for i := range 64 {
		go func() {
			defer func() { done <- struct{}{} }()
			for j := range 100 {
				c, cancel := l.WithTimeout(context.Background(), time.Duration(1+(i+j)%20)*time.Millisecond)
				if j%2 == 0 {
					cancel()
				} else {
					<-c.Done()
				}
			}
		}()
	}
	for range 64 {
		<-done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.due)
}
