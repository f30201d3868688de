package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/fencelock/fencelock/fencesql"
)

// A settlement written by three holders of the day's lock, in a
// transaction each: the holder of fence 33 pauses, the holder of 34 writes,
// and the first one's write after its pause is refused.
func Example() {
	ctx := context.Background()
	db, cleanup := exampleDB()
	defer cleanup()

	g, err := fencesql.NewGuard(fencesql.SQLite, "fences")
	if err != nil {
		log.Fatal(err)
	}
	if err := g.CreateTable(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE settlements (day TEXT PRIMARY KEY, total INTEGER NOT NULL, by TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	// settle is the critical section's write, fenced by the guard: the
	// settlements table needs no fence column. It settles a day once: the
	// guard refuses a holder older than one that wrote, not a stale holder
	// that writes first, so a newer holder must find the day settled.
	settle := func(fence int64, total int, by string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := g.Advance(ctx, tx, "settlement:2026-11-30", fence); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO settlements (day, total, by) VALUES ('2026-11-30', ?, ?)
			ON CONFLICT (day) DO NOTHING`, total, by)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // settled already: nothing to do
		}
		return tx.Commit()
	}
	fmt.Println("fence 34:", settle(34, 19329, "pod-2"))
	err = settle(33, 100, "pod-1") // after its pause
	fmt.Println("fence 33:", err)
	fmt.Println("stale:", errors.Is(err, fencesql.ErrStale))

	var total int
	var by string
	if err := db.QueryRowContext(ctx, `SELECT total, by FROM settlements`).Scan(&total, &by); err != nil {
		log.Fatal(err)
	}
	fmt.Println("settled:", total, "by", by)
	// Output:
	// fence 34: <nil>
	// fence 33: fencesql: stale fence: "settlement:2026-11-30" has fence 34 recorded, newer than this holder's 33
	// stale: true
	// settled: 19329 by pod-2
}

// A degraded run (fail-open, fence 0) holds no lock and has no fence, so
// two instances may ship the same order at once. Advance refuses fence 0;
// an idempotency key, recorded in the transaction that ships, lets one of
// them ship.
func Example_degraded() {
	ctx := context.Background()
	db, cleanup := exampleDB()
	defer cleanup()
	g, err := fencesql.NewGuard(fencesql.SQLite, "fences")
	if err != nil {
		log.Fatal(err)
	}
	if err := g.CreateTable(ctx, db); err != nil {
		log.Fatal(err)
	}

	ship := func(fence int64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		err = g.Advance(ctx, tx, "order:42", fence)
		switch {
		case errors.Is(err, fencesql.ErrNoFence):
			// Degraded: no fence to check. The key decides.
			if err := g.Once(ctx, tx, "ship:order:42"); err != nil {
				return err // ErrDone: shipped already
			}
		case err != nil:
			return err
		}
		// ... mark the order shipped if it is still paid (RowsAffected
		// checked), record the shipment under its unique key ...
		return tx.Commit()
	}
	fmt.Println("first degraded run:", ship(0))
	err = ship(0)
	fmt.Println("second degraded run:", err)
	fmt.Println("done before:", errors.Is(err, fencesql.ErrDone))
	// Output:
	// first degraded run: <nil>
	// second degraded run: fencesql: done before: key "ship:order:42"
	// done before: true
}

// exampleDB opens an SQLite file in a temporary directory.
func exampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "fencesql-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(dir, "example.db"))
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { _ = db.Close(); _ = os.RemoveAll(dir) }
}
