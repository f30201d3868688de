package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/fencesql"
)

// pgxExecer is an Execer over pgx's native API: a pgx.Tx, a *pgx.Conn, a
// *pgxpool.Pool or a pgxpool connection or transaction.
type pgxExecer struct {
	x interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

func (p pgxExecer) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := p.x.Exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxResult(tag), nil
}

// pgxResult is a command tag as a sql.Result: Advance and Once need only
// RowsAffected on PostgreSQL.
type pgxResult pgconn.CommandTag

func (r pgxResult) RowsAffected() (int64, error) { return pgconn.CommandTag(r).RowsAffected(), nil }
func (r pgxResult) LastInsertId() (int64, error) {
	return 0, errors.New("pgx: no LastInsertId on PostgreSQL")
}

// Using a Guard with pgx's native API, through a small adapter. (pgx's
// stdlib.OpenDBFromPool is the other way: a *sql.DB over the pool, with
// which a StaleError also names the recorded fence.)
func Example_pgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	g, err := fencesql.NewGuard(fencesql.Postgres, "fencelock_fences")
	if err != nil {
		log.Fatal(err)
	}
	if err := g.CreateTable(ctx, pgxExecer{pool}); err != nil {
		log.Fatal(err)
	}

	var fence int64 = 7 // lease.Fence()
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := g.Advance(ctx, pgxExecer{tx}, "settlement:2026-11-30", fence); err != nil {
		log.Fatal(err) // ErrStale: a newer holder wrote first
	}
	// ... the writes, with tx.Exec ...
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
