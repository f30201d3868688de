package benchmarks

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/fencelock/fencelock/fencesql"
)

// fencesqlPostgres is the PostgreSQL BenchmarkFenceSQL writes to.
const fencesqlPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// BenchmarkFenceSQL is the cost of the resource side of a lock on
// PostgreSQL: fenced writes of one row, each with a fence greater than the
// last, so every write lands. Over database/sql with pgx's stdlib, one
// connection, no contention. Each iteration runs the three writes in turn,
// so that all three meet the same load (the machine is shared), and times
// each; it reports the median of each and their ratios:
//
//   - handwritten: the single fenced statement a user writes without the
//     guard, UPDATE ... SET total = $1, fence_token = $2 WHERE id = $3 AND
//     fence_token < $2, checking RowsAffected (autocommit): the baseline.
//   - handwritten-tx: the same statement in a transaction (BEGIN, UPDATE,
//     COMMIT): what the transaction alone costs.
//   - guard-tx: fencesql's Advance, then the unfenced UPDATE, in a
//     transaction: the guard as the README uses it.
//
// durable commits as configured (synchronous_commit on: a WAL flush per
// commit); async-commit sets synchronous_commit off for the session, which
// leaves the statements' own cost.
func BenchmarkFenceSQL(b *testing.B) {
	for _, mode := range []struct{ name, set string }{
		{"durable", ""},
		{"async-commit", "SET synchronous_commit = off"},
	} {
		b.Run(mode.name, func(b *testing.B) { benchmarkFenceSQL(b, mode.set) })
	}
}

func benchmarkFenceSQL(b *testing.B, set string) {
	ctx := context.Background()
	db, err := sql.Open("pgx", fencesqlPostgres)
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_POSTGRES") == "1" {
			b.Fatalf("postgres at %s: %v", fencesqlPostgres, err)
		}
		b.Skipf("postgres at %s not reachable: %v", fencesqlPostgres, err)
	}
	b.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	if set != "" {
		if _, err := db.ExecContext(ctx, set); err != nil {
			b.Fatal(err)
		}
	}

	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	data, fences := "bench_data_"+hex.EncodeToString(suffix), "bench_fences_"+hex.EncodeToString(suffix)
	g, err := fencesql.NewGuard(fencesql.Postgres, fences)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.CreateTable(ctx, db); err != nil {
		b.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+data+` (id BIGINT PRIMARY KEY, total BIGINT NOT NULL, fence_token BIGINT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+data+`, `+fences+`, `+fences+`_keys`)
	})
	if _, err := db.ExecContext(ctx, `INSERT INTO `+data+` VALUES (1, 0, 0)`); err != nil {
		b.Fatal(err)
	}
	fenced := `UPDATE ` + data + ` SET total = $1, fence_token = $2 WHERE id = $3 AND fence_token < $2`
	unfenced := `UPDATE ` + data + ` SET total = $1 WHERE id = $2`
	var fence int64 // grows across the writes: every write lands

	handwritten := func(x fencesql.Execer) error {
		fence++
		res, err := x.ExecContext(ctx, fenced, fence, fence, 1)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errors.New("stale")
		}
		return nil
	}
	inTx := func(f func(tx *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := f(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	writes := []struct {
		name  string
		write func() error
		took  []time.Duration
	}{
		{name: "handwritten", write: func() error { return handwritten(db) }},
		{name: "handwritten-tx", write: func() error { return inTx(func(tx *sql.Tx) error { return handwritten(tx) }) }},
		{name: "guard-tx", write: func() error {
			return inTx(func(tx *sql.Tx) error {
				fence++
				if err := g.Advance(ctx, tx, "bench:1", fence); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, unfenced, fence, 1)
				return err
			})
		}},
	}
	for b.Loop() {
		for i := range writes {
			w := &writes[i]
			start := time.Now()
			if err := w.write(); err != nil {
				b.Fatal(err)
			}
			w.took = append(w.took, time.Since(start))
		}
	}
	median := make([]float64, len(writes))
	for i := range writes {
		slices.Sort(writes[i].took)
		median[i] = float64(writes[i].took[len(writes[i].took)/2].Nanoseconds())
		b.ReportMetric(median[i], writes[i].name+"-p50-ns")
	}
	b.ReportMetric(median[2]/median[0], "guard-tx/handwritten")
	b.ReportMetric(median[2]/median[1], "guard-tx/handwritten-tx")
}
