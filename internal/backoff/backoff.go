// Package backoff is the pause between retries: exponential from a minimum
// to a maximum, each value jittered to between half and all of it. Each
// call that retries keeps a Backoff of its own.
package backoff

import (
	"math/rand/v2"
	"time"
)

// A Backoff is one call's retry pause.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Reset starts the backoff over at Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Next returns the next pause.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.Min
	case b.cur > b.Max/2:
		b.cur = b.Max
	default:
		b.cur *= 2
	}
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}
