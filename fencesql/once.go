package fencesql

import (
	"context"
	"fmt"
	"time"
)

// Once records key, an idempotency key, in the keys table and returns nil,
// or returns an error matching ErrDone when a committed transaction has
// recorded it before. Call it in the transaction whose work the key names:
// if that transaction rolls back, so does the key, and a concurrent Once of
// the same key waits for its end. An invalid key (empty, over 255 bytes,
// not UTF-8, with NUL) returns ErrInvalid and sends no SQL.
func (g *Guard) Once(ctx context.Context, x Execer, key string) error {
	if err := checkValue("key", key); err != nil {
		return err
	}
	res, err := x.ExecContext(ctx, g.sql.once, key)
	if err != nil {
		return fmt.Errorf("fencesql: once %q: %w", key, err)
	}
	inserted, err := g.dialect.inserted(res)
	if err != nil {
		return fmt.Errorf("fencesql: once %q: %w", key, err)
	}
	if !inserted {
		return fmt.Errorf("%w: key %q", ErrDone, key)
	}
	return nil
}

// Prune deletes the keys recorded more than olderThan ago, by the
// database's clock (the one Once records with), and returns how many it
// deleted. After an error it may have deleted some, or none. An olderThan
// under a microsecond returns ErrInvalid and sends no SQL: a key younger
// than the longest time a duplicate can arrive must stay.
func (g *Guard) Prune(ctx context.Context, x Execer, olderThan time.Duration) (int64, error) {
	us := olderThan.Microseconds()
	if us <= 0 {
		return 0, fmt.Errorf("%w: prune keys older than %v", ErrInvalid, olderThan)
	}
	res, err := x.ExecContext(ctx, g.sql.prune, us)
	if err != nil {
		return 0, fmt.Errorf("fencesql: prune %s_keys: %w", g.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("fencesql: prune %s_keys: %w", g.table, err)
	}
	return n, nil
}
