package fencesql_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fencesql"
)

// TestOnce: a key is done once recorded by a committed transaction, not by
// one that rolled back; keys are compared exactly.
func TestOnce(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, _ := newGuard(t, d)
		onceSequence(t, d, g)
	})
}

func onceSequence(t *testing.T, d database, g *fencesql.Guard) {
	t.Helper()
	ctx := t.Context()
	inTx := func(commit bool, key string) error {
		t.Helper()
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = g.Once(ctx, tx, key)
		if commit && err == nil {
			if cerr := tx.Commit(); cerr != nil {
				t.Fatal(cerr)
			}
		} else if rerr := tx.Rollback(); rerr != nil {
			t.Fatal(rerr)
		}
		return err
	}
	if err := inTx(false, "payment:1"); err != nil {
		t.Fatalf("first Once, rolled back: %v", err)
	}
	if err := inTx(true, "payment:1"); err != nil {
		t.Fatalf("Once after a rollback: %v, want nil", err)
	}
	err := inTx(true, "payment:1")
	if !errors.Is(err, fencesql.ErrDone) {
		t.Fatalf("Once after a commit: %v, want ErrDone", err)
	}
	if want := `fencesql: done before: key "payment:1"`; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
	for _, key := range []string{"Payment:1", "payment:1 ", "payment:2"} {
		if err := g.Once(ctx, d.db, key); err != nil {
			t.Errorf("Once(%q) after payment:1: %v, want nil", key, err)
		}
	}
	// On one connection: a duplicate's answer does not leak into the next
	// new key's (MySQL's LAST_INSERT_ID).
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, s := range []struct {
		key  string
		done bool
	}{{"payment:3", false}, {"payment:3", true}, {"payment:4", false}, {"payment:4", true}, {"payment:5", false}} {
		if err := g.Once(ctx, conn, s.key); errors.Is(err, fencesql.ErrDone) != s.done || (err != nil && !s.done) {
			t.Errorf("Once(%q) on one connection: %v, want done %v", s.key, err, s.done)
		}
	}
}

// TestOnceWaitsForTransaction: a concurrent Once of the same key waits for
// the transaction that recorded it, and is done if it committed, not if it
// rolled back.
func TestOnceWaitsForTransaction(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, _ := newGuard(t, d)
		for _, commit := range []bool{true, false} {
			key := "order:" + map[bool]string{true: "commit", false: "rollback"}[commit]
			first := begin(t, d)
			if err := g.Once(t.Context(), first, key); err != nil {
				t.Fatal(err)
			}
			second := begin(t, d)
			done := make(chan error, 1)
			go func() { done <- g.Once(t.Context(), second, key) }()
			select {
			case err := <-done:
				t.Fatalf("second Once returned %v while the first transaction was open", err)
			case <-time.After(300 * time.Millisecond):
			}
			end(t, first, commit)
			err := <-done
			end(t, second, false)
			if commit && !errors.Is(err, fencesql.ErrDone) {
				t.Errorf("after the first committed: %v, want ErrDone", err)
			}
			if !commit && err != nil {
				t.Errorf("after the first rolled back: %v, want nil", err)
			}
		}
	})
}

func begin(t *testing.T, d database) *sql.Tx {
	t.Helper()
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func end(t *testing.T, tx *sql.Tx, commit bool) {
	t.Helper()
	var err error
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestPrune: Prune deletes the keys older than its age by the database's
// clock, says how many, and leaves the others done.
func TestPrune(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, table := newGuard(t, d)
		ctx := t.Context()
		for _, k := range []string{"old-1", "old-2", "old-3", "new"} {
			if err := g.Once(ctx, d.db, k); err != nil {
				t.Fatal(err)
			}
		}
		// The keys table's schema, as documented: created_us in
		// microseconds since the epoch, by the database's clock, which on
		// this machine is the test's.
		var created int64
		if err := d.db.QueryRowContext(ctx, d.q("SELECT created_us FROM "+table+"_keys WHERE idem_key = ?"), "new").Scan(&created); err != nil {
			t.Fatal(err)
		}
		if age := time.Since(time.UnixMicro(created)); age < -5*time.Second || age > 5*time.Second {
			t.Errorf("key recorded at %v, %v from now", time.UnixMicro(created), age)
		}
		// Two hours ago, one and a half, and twenty minutes.
		for k, ago := range map[string]time.Duration{"old-1": 2 * time.Hour, "old-2": 90 * time.Minute, "old-3": 20 * time.Minute} {
			if _, err := d.db.ExecContext(ctx, d.q("UPDATE "+table+"_keys SET created_us = created_us - ? WHERE idem_key = ?"), ago.Microseconds(), k); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range []struct {
			olderThan time.Duration
			want      int64
		}{{3 * time.Hour, 0}, {time.Hour, 2}, {time.Hour, 0}, {10 * time.Minute, 1}} {
			n, err := g.Prune(ctx, d.db, s.olderThan)
			if err != nil || n != s.want {
				t.Errorf("Prune(%v) = %d, %v; want %d", s.olderThan, n, err, s.want)
			}
		}
		for k, done := range map[string]bool{"old-1": false, "old-2": false, "old-3": false, "new": true} {
			err := g.Once(ctx, d.db, k)
			if errors.Is(err, fencesql.ErrDone) != done || (err != nil && !done) {
				t.Errorf("Once(%q) after Prune: %v, want done %v", k, err, done)
			}
		}
		// A key recorded just now is younger than a minute, and older than
		// a millisecond a little later.
		if n, err := g.Prune(ctx, d.db, time.Minute); err != nil || n != 0 {
			t.Errorf("Prune(1m) right after Once = %d, %v; want 0", n, err)
		}
		time.Sleep(20 * time.Millisecond)
		if n, err := g.Prune(ctx, d.db, time.Millisecond); err != nil || n != 4 {
			t.Errorf("Prune(1ms) = %d, %v; want 4", n, err)
		}
	})
}

// TestOnceRecordsStatementTime: a key's time is when Once ran, not when
// its transaction began, so a key recorded late in a long transaction is
// not pruned early (PostgreSQL's now() is the transaction's start).
func TestOnceRecordsStatementTime(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, table := newGuard(t, d)
		ctx := t.Context()
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		// Start the transaction on the server (a BEGIN alone may be lazy).
		if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		before := time.Now()
		if err := g.Once(ctx, tx, "late"); err != nil {
			t.Fatal(err)
		}
		var created int64
		if err := tx.QueryRowContext(ctx, d.q("SELECT created_us FROM "+table+"_keys WHERE idem_key = ?"), "late").Scan(&created); err != nil {
			t.Fatal(err)
		}
		if lag := before.Sub(time.UnixMicro(created)); lag > 500*time.Millisecond {
			t.Errorf("key recorded %v before its Once ran, want when it ran", lag)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n, err := g.Prune(ctx, d.db, time.Second); err != nil || n != 0 {
			t.Errorf("Prune(1s) right after the commit = %d, %v; want 0", n, err)
		}
	})
}

// TestOnceMySQLKeyTimeNotPositive: a key whose recorded time is 0 or
// negative (a row written by hand, a clock before 1970) is still done, whether
// the driver counts rows found or rows changed: the MySQL dialect does not
// read the duplicate's time as its answer.
func TestOnceMySQLKeyTimeNotPositive(t *testing.T) {
	for _, dsn := range []string{mysqlDSN, mysqlDSN + "?clientFoundRows=true"} {
		t.Run(dsn, func(t *testing.T) {
			d := openReal(t, "mariadb", fencesql.MySQL, "mysql", dsn, "FENCELOCK_REQUIRE_MYSQL")
			g, table := newGuard(t, d)
			ctx := t.Context()
			for _, created := range []int64{0, -5} {
				key := fmt.Sprint("k", created)
				if _, err := d.db.ExecContext(ctx, "INSERT INTO "+table+"_keys (idem_key, created_us) VALUES (?, ?)", key, created); err != nil {
					t.Fatal(err)
				}
				if err := g.Once(ctx, d.db, key); !errors.Is(err, fencesql.ErrDone) {
					t.Errorf("Once(%q) recorded at %d: %v, want ErrDone", key, created, err)
				}
			}
		})
	}
}
