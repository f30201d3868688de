package deployment

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/store"
)

// TestAutoPipelinerClientFound: what a Deployment reads of the client
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
	assert.Equal(t, 3, clientDB(Base(ap)), "its client's database")
	assert.True(t, honoursDeadlines(c))
	assert.False(t, honoursDeadlines(ap), "it runs batches on its own context")
	require.NoError(t, Usable(ap))

	d := New(ap, Config{})
	t.Cleanup(func() { d.Close(time.Now()) })
	assert.Same(t, ap, d.client, "the scripts go through the AutoPipeliner")
	assert.Same(t, c, d.base, "subscriptions and WAIT through its client")
	assert.Equal(t, "lock:{a}@3", d.Channel("lock:{a}"))
	assert.False(t, d.Traits().Deadlines)
}

// TestKeySlot: the Cluster slot of a hash tag, as Redis computes it
// (CRC16/XMODEM modulo 16384; the vectors are Redis's own).
func TestKeySlot(t *testing.T) {
	for tag, slot := range map[string]int{"123456789": 12739, "foo": 12182, "bar": 5061, "": 0} {
		assert.Equal(t, slot, keySlot(tag), tag)
	}
}

// TestTogether: one script takes several locks on one server, or when
// their names share a Cluster slot; a Ring's shards are its own hash's.
func TestTogether(t *testing.T) {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cluster.Close() })
	d := &Deployment{base: cluster}
	assert.True(t, d.Together([]string{"123456789", "123456789"}))
	assert.False(t, d.Together([]string{"foo", "bar"}))
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	d.base = ring
	assert.True(t, d.Together([]string{"foo"}))
	assert.False(t, d.Together([]string{"foo", "bar"}))
	d.base = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	assert.True(t, d.Together([]string{"foo", "bar"}))
}

// TestTranslate: go-redis's own errors mean what they say for a lock: a
// closed client refuses (and sent nothing), a pool with no connection to
// give sent nothing.
func TestTranslate(t *testing.T) {
	d := &Deployment{}
	closed := d.translate(fmt.Errorf("x: %w", redis.ErrClosed))
	assert.Equal(t, store.Misconfigured, store.ClassOf(closed))
	assert.True(t, store.Unsent(closed))
	assert.ErrorIs(t, closed, redis.ErrClosed)
	pool := d.translate(redis.ErrPoolTimeout)
	assert.Equal(t, store.Unavailable, store.ClassOf(pool))
	assert.True(t, store.Unsent(pool))
	assert.Nil(t, d.translate(nil))
}
