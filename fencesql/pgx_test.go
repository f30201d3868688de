package fencesql_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock/fencesql"
)

// TestPgx: a Guard works on pgx's native API through the example's
// adapter (pgx.Tx, *pgxpool.Pool, *pgx.Conn), and on pgx's stdlib over a
// pool, which names the recorded fence.
func TestPgx(t *testing.T) {
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, postgresDSN)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("postgres not reachable and FENCELOCK_REQUIRE_POSTGRES=1: %v", err)
		}
		t.Skipf("postgres not reachable (%v); set FENCELOCK_REQUIRE_POSTGRES=1 to fail instead", err)
	}
	t.Cleanup(pool.Close) // after the drop below: cleanups run last first
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	d := database{name: "postgres", dialect: fencesql.Postgres, db: db}
	table := tableName(t)
	g, err := fencesql.NewGuard(fencesql.Postgres, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateTable(ctx, pgxExecer{pool}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_keys"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})

	// In a pgx.Tx: the fence and the key land with the commit.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Advance(ctx, pgxExecer{tx}, "r", 5); err != nil {
		t.Fatal(err)
	}
	if err := g.Once(ctx, pgxExecer{tx}, "k"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// A stale holder in a pgx.Tx waits for the one ahead, then is refused.
	ahead, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Rollback(context.Background())
	if err := g.Advance(ctx, pgxExecer{ahead}, "r", 9); err != nil {
		t.Fatal(err)
	}
	behind, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer behind.Rollback(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Advance(ctx, pgxExecer{behind}, "r", 8) }()
	select {
	case err := <-done:
		t.Fatalf("Advance returned %v while the holder of fence 9 was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ahead.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var stale *fencesql.StaleError
	if !errors.As(err, &stale) || stale.Recorded != 0 || stale.Fence != 8 {
		t.Errorf("through the adapter: %v, want a StaleError for fence 8 that cannot name the recorded one", err)
	}
	if err := behind.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// On the pool and on a *pgx.Conn: ErrDone, Prune.
	if err := g.Once(ctx, pgxExecer{pool}, "k"); !errors.Is(err, fencesql.ErrDone) {
		t.Errorf("Once on the pool: %v, want ErrDone", err)
	}
	conn, err := pgx.Connect(ctx, postgresDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := g.Advance(ctx, pgxExecer{conn}, "r", 9); err != nil {
		t.Errorf("the same fence again on a *pgx.Conn: %v", err)
	}
	if n, err := g.Prune(ctx, pgxExecer{conn}, time.Hour); err != nil || n != 0 {
		t.Errorf("Prune on a *pgx.Conn = %d, %v; want 0", n, err)
	}

	// pgx's stdlib over the same pool: a *sql.DB, which can query.
	err = g.Advance(ctx, db, "r", 3)
	if !errors.As(err, &stale) || stale.Recorded != 9 {
		t.Errorf("through stdlib: %v, want a StaleError naming fence 9", err)
	}
	if got := d.recordedFence(t, table, "r"); got != 9 {
		t.Errorf("recorded %d, want 9", got)
	}
}
