package goredis

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/store"
)

// TestAutoPipelinerClientFound: what a Client reads of the client
// behind an AutoPipeliner, found in go-redis's unexported field: its
// database for the wake-up channels, and that a batched call honours no
// deadline, even with ContextTimeoutEnabled.
func TestAutoPipelinerClientFound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(&redis.Options{DB: 3, ContextTimeoutEnabled: true})
	ap, err := c.AutoPipeline()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ap.Close() })
	assert.Same(t, c, behind(ap), "the client behind the AutoPipeliner")
	assert.Same(t, c, Base(ap))
	require.NoError(t, Usable(ap))
	assert.True(t, New(c, driver.Options{}).Deadlines())
	cl := New(ap, driver.Options{})
	assert.False(t, cl.Deadlines(), "it runs batches on its own context")
	assert.Equal(t, 3, cl.DB(), "its client's database")
	assert.Same(t, ap, cl.client, "the scripts go through the AutoPipeliner")
	assert.Same(t, c, cl.base, "subscriptions and WAIT through its client")
}

// TestTranslate: go-redis's own errors mean what they say for a lock: a
// closed client refuses (and sent nothing), a pool with no connection to
// give sent nothing.
func TestTranslate(t *testing.T) {
	closed := translate(fmt.Errorf("x: %w", redis.ErrClosed))
	assert.Equal(t, store.Misconfigured, store.ClassOf(closed))
	assert.True(t, store.Unsent(closed))
	assert.ErrorIs(t, closed, redis.ErrClosed)
	pool := translate(redis.ErrPoolTimeout)
	assert.Equal(t, store.Unavailable, store.ClassOf(pool))
	assert.True(t, store.Unsent(pool))
	assert.Nil(t, translate(nil))
}
