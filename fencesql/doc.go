// Package fencesql is the resource side of a lock: a SQL database that
// refuses the writes of a holder that lost its lock once a newer holder
// wrote (a fence guard), and records the work done once (idempotency keys).
// A Redis lock keeps instances from doing the same work twice; the guard
// refuses a stale holder that writes after a newer one, not one that writes
// first, whose fence is then the greatest recorded. Work meant to happen
// once also writes as a conditional update on the row's state, checking the
// rows it changed, so that the newer holder finds it done.
//
// It uses the standard library only, so it runs wherever the writes
// happen, with any database/sql driver for PostgreSQL, SQLite, MySQL or
// MariaDB. The fence is any positive, per-resource increasing number, such
// as fencelock's Lease.Fence:
//
//	g, err := fencesql.NewGuard(fencesql.Postgres, "fencelock_fences")
//	err = g.CreateTable(ctx, db) // once, at start-up
//
//	tx, err := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	if err := g.Advance(ctx, tx, "settlement:"+day, lease.Fence()); err != nil {
//		return err // ErrStale: a newer holder wrote first; nothing of tx lands
//	}
//	// ... the critical section's writes, to any tables, in tx; work meant to
//	// happen once conditional on the row's state, RowsAffected checked:
//	// UPDATE settlements SET status = 'done' WHERE ... AND status = 'pending'
//	return tx.Commit()
//
// # The tables
//
// A Guard keeps two tables, created by CreateTable:
//
//	table       (resource TEXT PRIMARY KEY, fence BIGINT NOT NULL)
//	table_keys  (idem_key TEXT PRIMARY KEY, created_us BIGINT NOT NULL), indexed on created_us
//
// fence is the greatest fence recorded for the resource; created_us is
// when Once's statement ran, in microseconds since the Unix epoch by the
// database's clock; a key is visible to others only from its commit, so
// Prune's olderThan counts from up to a transaction's length before. On
// MySQL the text columns are VARBINARY(255), compared byte for byte.
//
// # Transactions
//
// Advance's upsert locks the resource's row until its transaction ends, so
// a competing holder's Advance waits for that end, then compares its fence
// with the one committed: a smaller fence gets ErrStale, whichever tables
// either writes. Call Advance first in the transaction: a stale holder then
// does no work. Roll back on any error: under PostgreSQL's REPEATABLE READ
// or SERIALIZABLE a competing holder may get a serialization failure
// instead of ErrStale, and on MySQL holders racing to insert a resource's
// first row may get a deadlock error (1213). SQLite
// locks the whole database for a writer: give the connection a busy
// timeout, and start the transaction with Advance, or with BEGIN IMMEDIATE
// (modernc.org/sqlite: _txlock=immediate), so that it reads nothing before
// it holds the lock.
//
// # Degraded runs
//
// A degraded (fail-open) lease has fence 0, which is not a fence: Advance
// refuses it with ErrNoFence. A degraded run holds no lock, so another
// instance may run the same work at the same moment; it writes through
// what keeps the work safe twice instead: Once with a key naming the work,
// a unique key of its own table (INSERT ... ON CONFLICT DO NOTHING), or a
// conditional update on the row's state (UPDATE ... WHERE status = 'paid').
//
// # pgx
//
// pgx's stdlib (stdlib.OpenDBFromPool) gives a *sql.DB over a pgxpool. A
// pgx.Tx or pgxpool.Pool serves as an Execer through a few lines of adapter,
// shown in the package example; through it a StaleError does not name the
// recorded fence.
package fencesql
