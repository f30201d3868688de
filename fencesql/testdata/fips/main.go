// Command fips uses fencesql with fencelock's leases as a program does, for
// TestFIPS140Only, which runs it with GODEBUG=fips140=only: two holders of
// a lock in turn write through a Guard to the SQLite database -db, the
// first one's write after the second's is refused, and an idempotency key
// is recorded once. It prints "ok" when every step did what it should,
// else the first that did not, and exits 1.
package main

import (
	"context"
	"crypto/fips140"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/fencesql"
)

func main() {
	addr := flag.String("addr", "", "a redis-server's address")
	dbPath := flag.String("db", "", "the SQLite database's file")
	name := flag.String("name", "fips", "the lock's name")
	flag.Parse()
	if err := run(*addr, *dbPath, *name); err != nil {
		fmt.Fprintln(os.Stderr, "fips:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(addr, dbPath, name string) error {
	if !fips140.Enforced() {
		return errors.New("not in FIPS 140-only mode: run with GODEBUG=fips140=only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	locker, err := fencelock.New(client, nil)
	if err != nil {
		return err
	}
	defer locker.Close()
	db, err := sql.Open("sqlite", dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return err
	}
	defer db.Close()
	g, err := fencesql.NewGuard(fencesql.SQLite, "fences")
	if err != nil {
		return err
	}
	if err := g.CreateTable(ctx, db); err != nil {
		return err
	}

	// write records fence for name, and key once, in one transaction.
	write := func(fence int64, key string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := g.Advance(ctx, tx, name, fence); err != nil {
			return err
		}
		if err := g.Once(ctx, tx, key); err != nil {
			return err
		}
		return tx.Commit()
	}
	first, err := locker.Acquire(ctx, name)
	if err != nil {
		return err
	}
	if err := first.Release(ctx); err != nil {
		return err
	}
	second, err := locker.Acquire(ctx, name)
	if err != nil {
		return err
	}
	defer second.Release(ctx)
	if err := write(second.Fence(), "work:2"); err != nil {
		return fmt.Errorf("the second holder's write: %w", err)
	}
	if err := write(first.Fence(), "work:1"); !errors.Is(err, fencesql.ErrStale) {
		return fmt.Errorf("the first holder's write after the second's: %v, want ErrStale", err)
	}
	if err := write(second.Fence(), "work:2"); !errors.Is(err, fencesql.ErrDone) {
		return fmt.Errorf("the same work again: %v, want ErrDone", err)
	}
	if _, err := g.Prune(ctx, db, time.Hour); err != nil {
		return err
	}
	return second.Release(ctx)
}
