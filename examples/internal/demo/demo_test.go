package demo

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRebind(t *testing.T) {
	tests := []struct {
		query, postgres string
	}{
		{"SELECT 1", "SELECT 1"},
		{"UPDATE t SET a = ?, b = ? WHERE c = ? AND d < ?", "UPDATE t SET a = $1, b = $2 WHERE c = $3 AND d < $4"},
		{"SELECT '?' , ? FROM \"odd?name\" WHERE x = ?", "SELECT '?' , $1 FROM \"odd?name\" WHERE x = $2"},
		{"SELECT 'it''s ?', ?", "SELECT 'it''s ?', $1"},
		{"INSERT INTO t VALUES (?,?,?,?,?,?,?,?,?,?)", "INSERT INTO t VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"},
	}
	sqlite, pg := &DB{Driver: "sqlite"}, &DB{Driver: "pgx"}
	for _, tt := range tests {
		assert.Equal(t, tt.postgres, pg.Rebind(tt.query), "postgres: %s", tt.query)
		assert.Equal(t, tt.query, sqlite.Rebind(tt.query), "sqlite: %s", tt.query)
	}
}

func TestOpenDBRejects(t *testing.T) {
	for _, url := range []string{"mysql://x", "sqlite:///tmp/x.db", "postgres://%zz@x"} {
		_, err := OpenDB(t.Context(), url)
		assert.Error(t, err, url)
	}
}

// TestRedisNoAnswer: a Redis that is not there is an outage (ErrNoAnswer),
// a bad address is not, and RedisClient makes no call to find out.
func TestRedisNoAnswer(t *testing.T) {
	const down = "127.0.0.1:1" // nothing listens on port 1
	_, err := NewRedisClient(t.Context(), down)
	require.ErrorIs(t, err, ErrNoAnswer)
	assert.Contains(t, err.Error(), "redis at 127.0.0.1:1 does not answer: dial tcp")
	_, err = StartRedis(t.Context(), down)
	assert.ErrorIs(t, err, ErrNoAnswer)
	assert.ErrorIs(t, DeleteKeys(t.Context(), down, "k"), ErrNoAnswer)

	for _, addr := range []string{"localhost", "redis://%zz"} {
		_, err := NewRedisClient(t.Context(), addr)
		require.Error(t, err, addr)
		assert.NotErrorIs(t, err, ErrNoAnswer, addr)
		_, err = RedisClient(addr)
		assert.Error(t, err, addr)
	}

	begin := time.Now()
	c, err := RedisClient(down)
	require.NoError(t, err)
	assert.Less(t, time.Since(begin), 100*time.Millisecond, "no dial")
	assert.NoError(t, c.Close())
}

func TestTimelineLogger(t *testing.T) {
	var b bytes.Buffer
	log := NewTimeline(&b).Logger("pod-1", slog.LevelWarn)
	log.Info("not shown")
	log.Error("fencelock: lost", "lock", "x")
	assert.Regexp(t, `^ *\d+\.\d\ds  pod-1      level=ERROR msg="fencelock: lost" lock=x\n$`, b.String())
}
