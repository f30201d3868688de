// Package demotest holds what the examples' tests share: their TestMain,
// running the example's command, and the real servers they run the story
// against besides the embedded ones: the shared Redis at 127.0.0.1:6379 and
// the local PostgreSQL database test.
//
// When a server does not answer, the test is skipped with a message saying
// so, unless FENCELOCK_REQUIRE_REDIS=1 (Redis) or FENCELOCK_REQUIRE_POSTGRES=1
// (PostgreSQL) is set, which turns the skip into a failure: CI sets both, so
// that a missing server cannot pass as a green run.
package demotest

import (
	"context"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// The real servers the tests use.
const (
	RedisAddr   = "127.0.0.1:6379"
	PostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

// RealRedis returns RedisAddr if a Redis answers there; otherwise it skips t,
// or fails it when FENCELOCK_REQUIRE_REDIS=1.
func RealRedis(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := demo.NewRedisClient(ctx, RedisAddr)
	if err != nil {
		unavailable(t, "FENCELOCK_REQUIRE_REDIS", "Redis", err)
	}
	_ = c.Close()
	return RedisAddr
}

// RealPostgres returns PostgresURL if the database answers there; otherwise
// it skips t, or fails it when FENCELOCK_REQUIRE_POSTGRES=1.
func RealPostgres(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	db, err := demo.Connect(ctx, "pgx", PostgresURL)
	if err != nil {
		unavailable(t, "FENCELOCK_REQUIRE_POSTGRES", "PostgreSQL", err)
	}
	_ = db.Close()
	return PostgresURL
}

func unavailable(t testing.TB, env, what string, err error) {
	t.Helper()
	if os.Getenv(env) == "1" {
		t.Fatalf("%s not reachable and %s=1: %v", what, env, err)
	}
	t.Skipf("%s not reachable (%v); start it or set %s=1 to fail instead of skipping", what, err, env)
}

// Output returns a writer to t's output that is safe for concurrent use:
// the examples write to it from several goroutines, among them os/exec's
// copying of child processes' stderr.
func Output(t *testing.T) io.Writer {
	return &lockedWriter{w: t.Output()}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer // guarded by mu
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
