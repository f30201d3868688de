package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencelock/fencelock/fencesql"
)

// dataTable creates a table for the writes of the critical sections: one
// row per transaction, with the fence it held.
func dataTable(t *testing.T, d database, guardTable string) string {
	t.Helper()
	table := guardTable + "_data"
	if _, err := d.db.ExecContext(t.Context(), "CREATE TABLE "+table+" (txid BIGINT PRIMARY KEY, fence BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return table
}

// TestAdvanceConcurrent runs transactions from 8 goroutines with random
// fences on one resource. Each writes its row first, then calls Advance,
// then commits (or, one in five, rolls back). It checks that:
//   - the recorded fence only grows, as a reader polling it sees;
//   - an accepted Advance holds the greatest fence committed so far, and the
//     recorded fence is its own until its transaction ends;
//   - every transaction whose Advance failed, and every one rolled back,
//     left no row behind: the rows are those of the committed ones exactly;
//   - the fence recorded at the end is the greatest committed.
//
// It runs twice: on a resource whose row exists, where no transaction
// fails otherwise, and on a new one, where on MySQL competing first
// inserts of the row may deadlock (and roll back).
func TestAdvanceConcurrent(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		for _, exists := range []bool{true, false} {
			t.Run(map[bool]string{true: "existing row", false: "new resource"}[exists], func(t *testing.T) {
				advanceConcurrent(t, d, exists)
			})
		}
	})
}

func advanceConcurrent(t *testing.T, d database, exists bool) {
	{
		g, table := newGuard(t, d)
		data := dataTable(t, d, table)
		t.Cleanup(func() { _, _ = d.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+data) })
		const resource = "settlement:2026-11-30"
		ctx := t.Context()
		if exists {
			if err := g.Advance(ctx, d.db, resource, 1); err != nil {
				t.Fatal(err)
			}
		}

		// The reader: the recorded fence, polled, never goes down.
		stop := make(chan struct{})
		var polls atomic.Int64
		readerErr := make(chan error, 1)
		go func() {
			var last int64
			for {
				select {
				case <-stop:
					readerErr <- nil
					return
				case <-time.After(time.Millisecond):
				}
				var f int64
				err := d.db.QueryRowContext(ctx, d.q("SELECT fence FROM "+table+" WHERE resource = ?"), resource).Scan(&f)
				if errors.Is(err, sql.ErrNoRows) {
					continue
				}
				if err != nil {
					readerErr <- err
					return
				}
				if f < last {
					readerErr <- fmt.Errorf("the recorded fence went from %d down to %d", last, f)
					return
				}
				last = f
				polls.Add(1)
			}
		}()

		var (
			issued    atomic.Int64 // fences grow with it, with jitter
			txids     atomic.Int64
			mu        sync.Mutex
			committed = map[int64]int64{} // txid → fence; guarded by mu
			refused   int                 // guarded by mu
			rolled    int                 // guarded by mu
			deadlocks int                 // guarded by mu
		)
		const workers, perWorker = 8, 25
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for range perWorker {
					txid := txids.Add(1)
					fence := max(1, issued.Add(3)-rng.Int64N(30))
					outcome, err := oneTx(ctx, d, g, table, data, resource, txid, fence, rng.IntN(5) == 0)
					var myErr *mysql.MySQLError
					if !exists && errors.As(err, &myErr) && myErr.Number == 1213 {
						outcome, err = "deadlock", nil
					}
					if err != nil {
						errs[w] = fmt.Errorf("tx %d, fence %d: %w", txid, fence, err)
						return
					}
					mu.Lock()
					switch outcome {
					case "committed":
						committed[txid] = fence
					case "refused":
						refused++
					case "rolled back":
						rolled++
					case "deadlock":
						deadlocks++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(stop)
		if err := errors.Join(append(errs, <-readerErr)...); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d committed, %d refused (stale), %d rolled back after Advance, %d deadlocked; the reader polled %d times",
			len(committed), refused, rolled, deadlocks, polls.Load())
		if len(committed) == 0 || refused == 0 || rolled == 0 {
			t.Fatal("want transactions of each outcome")
		}

		rows, err := d.db.QueryContext(ctx, "SELECT txid, fence FROM "+data)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[int64]int64{}
		for rows.Next() {
			var txid, fence int64
			if err := rows.Scan(&txid, &fence); err != nil {
				t.Fatal(err)
			}
			got[txid] = fence
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for txid, fence := range got {
			if want, ok := committed[txid]; !ok || want != fence {
				t.Errorf("row of tx %d (fence %d) left behind by a transaction that did not commit", txid, fence)
			}
		}
		for txid := range committed {
			if _, ok := got[txid]; !ok {
				t.Errorf("committed tx %d has no row", txid)
			}
		}
		greatest := slices.Max(slices.Collect(func(yield func(int64) bool) {
			for _, f := range committed {
				if !yield(f) {
					return
				}
			}
		}))
		if rec := d.recordedFence(t, table, resource); rec != greatest {
			t.Errorf("recorded fence %d, want the greatest committed, %d", rec, greatest)
		}
	}
}

// oneTx is one transaction of TestAdvanceConcurrent. It returns an error
// for anything the guard should have prevented, or that failed.
func oneTx(ctx context.Context, d database, g *fencesql.Guard, table, data, resource string,
	txid, fence int64, rollback bool) (outcome string, err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, d.q("INSERT INTO "+data+" (txid, fence) VALUES (?, ?)"), txid, fence); err != nil {
		return "", err
	}
	err = g.Advance(ctx, tx, resource, fence)
	var stale *fencesql.StaleError
	switch {
	case errors.As(err, &stale):
		if stale.Recorded <= fence {
			return "", fmt.Errorf("refused by recorded fence %d, not greater: %w", stale.Recorded, err)
		}
		return "refused", tx.Rollback()
	case err != nil:
		return "", err
	}
	// This transaction holds the resource's row: what it reads now is
	// what the holders before it committed.
	var recorded int64
	if err := tx.QueryRowContext(ctx, d.q("SELECT fence FROM "+table+" WHERE resource = ?"), resource).Scan(&recorded); err != nil {
		return "", err
	}
	if recorded != fence {
		return "", fmt.Errorf("the recorded fence is %d inside the transaction that recorded %d", recorded, fence)
	}
	var before sql.NullInt64
	if err := tx.QueryRowContext(ctx, d.q("SELECT MAX(fence) FROM "+data+" WHERE txid <> ?"), txid).Scan(&before); err != nil {
		return "", err
	}
	if before.Int64 > fence {
		return "", fmt.Errorf("accepted, though a transaction with fence %d committed before", before.Int64)
	}
	if rollback {
		return "rolled back", tx.Rollback()
	}
	return "committed", tx.Commit()
}

// TestAdvanceStartedFirstCommitsLast: a transaction with a smaller fence
// that started first, and wrote first, is refused when it calls Advance
// after a transaction with a greater fence committed; its writes roll back.
func TestAdvanceStartedFirstCommitsLast(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, table := newGuard(t, d)
		data := dataTable(t, d, table)
		t.Cleanup(func() { _, _ = d.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+data) })
		ctx := t.Context()
		insert := d.q("INSERT INTO " + data + " (txid, fence) VALUES (?, ?)")

		old := begin(t, d) // fence 5, paused before it could finish
		if d.dialect != fencesql.SQLite {
			// SQLite locks the whole database for a writer from its first
			// write: there the old holder writes after the new one.
			if _, err := old.ExecContext(ctx, insert, 1, 5); err != nil {
				t.Fatal(err)
			}
		}
		newer := begin(t, d) // fence 6
		if err := g.Advance(ctx, newer, "r", 6); err != nil {
			t.Fatal(err)
		}
		if _, err := newer.ExecContext(ctx, insert, 2, 6); err != nil {
			t.Fatal(err)
		}
		end(t, newer, true)

		if d.dialect == fencesql.SQLite {
			if _, err := old.ExecContext(ctx, insert, 1, 5); err != nil {
				t.Fatal(err)
			}
		}
		err := g.Advance(ctx, old, "r", 5)
		var stale *fencesql.StaleError
		if !errors.As(err, &stale) || stale.Recorded != 6 {
			t.Fatalf("the old holder's Advance: %v, want a StaleError naming fence 6", err)
		}
		end(t, old, false)

		var n int
		if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+data+" WHERE txid = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Error("the refused transaction's row landed")
		}
		if got := d.recordedFence(t, table, "r"); got != 6 {
			t.Errorf("recorded fence %d, want 6", got)
		}
	})
}

// TestAdvanceWaitsForHolder: a competing holder's Advance waits while the
// transaction that recorded a greater fence is open, then is refused if it
// committed, and accepted if it rolled back.
func TestAdvanceWaitsForHolder(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, table := newGuard(t, d)
		ctx := t.Context()
		if err := g.Advance(ctx, d.db, "r", 1); err != nil { // the row exists
			t.Fatal(err)
		}
		for _, commit := range []bool{true, false} {
			ahead := begin(t, d)
			fence := d.recordedFence(t, table, "r") + 10
			if err := g.Advance(ctx, ahead, "r", fence); err != nil {
				t.Fatal(err)
			}
			behind := begin(t, d)
			done := make(chan error, 1)
			go func() { done <- g.Advance(ctx, behind, "r", fence-1) }()
			select {
			case err := <-done:
				t.Fatalf("Advance(%d) returned %v while the transaction holding fence %d was open", fence-1, err, fence)
			case <-time.After(300 * time.Millisecond):
			}
			end(t, ahead, commit)
			err := <-done
			if commit {
				var stale *fencesql.StaleError
				if !errors.As(err, &stale) || stale.Recorded != fence {
					t.Errorf("after the holder of fence %d committed: %v, want a StaleError naming it", fence, err)
				}
				end(t, behind, false)
				continue
			}
			if err != nil {
				t.Errorf("after the holder of fence %d rolled back: %v, want nil", fence, err)
			}
			end(t, behind, true)
			if got := d.recordedFence(t, table, "r"); got != fence-1 {
				t.Errorf("recorded %d, want %d", got, fence-1)
			}
		}
	})
}
