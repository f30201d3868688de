package backoff

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 8 * time.Millisecond, Max: 64 * time.Millisecond}
	for i, ceil := range []time.Duration{8, 16, 32, 64, 64, 64} {
		ceil *= time.Millisecond
		d := b.Next()
		assert.GreaterOrEqual(t, d, ceil/2, "pause %d", i)
		assert.LessOrEqual(t, d, ceil, "pause %d", i)
	}
	b.Reset()
	assert.LessOrEqual(t, b.Next(), 8*time.Millisecond, "Reset starts over at Min")
}

// TestBackoffNeverOverflows: doubling past the largest duration stops at
// Max, and no pause is negative.
func TestBackoffNeverOverflows(t *testing.T) {
	bo := Backoff{Min: time.Millisecond, Max: math.MaxInt64}
	for i := range 200 {
		require.GreaterOrEqual(t, bo.Next(), time.Duration(0), "step %d", i)
	}
}
