package fencesql

import (
	"context"
	"fmt"
)

// Advance records fence as resource's newest, in one statement, if it is
// greater than or equal to the fence recorded (equal: the same lease writing
// again), and returns nil. Call it in the transaction that does the
// lease's writes, first: it locks resource's row until the transaction
// ends, so competing holders serialise on it, and a holder whose fence is
// smaller than one committed gets a *StaleError matching ErrStale. Then, or
// on any other error, roll the transaction back: none of its writes, to any
// table, land.
//
// The StaleError names the recorded fence where it can be read: always on
// MySQL, and on the others when x also has QueryRowContext (*sql.DB,
// *sql.Tx, *sql.Conn). Fence 0, a degraded lease's, returns ErrNoFence; an
// invalid resource (empty, over 255 bytes, not UTF-8, with NUL) or a
// negative fence returns ErrInvalid; neither sends any SQL.
func (g *Guard) Advance(ctx context.Context, x Execer, resource string, fence int64) error {
	if err := checkValue("resource", resource); err != nil {
		return err
	}
	switch {
	case fence == 0:
		return fmt.Errorf("%w: advance %q with fence 0", ErrNoFence, resource)
	case fence < 0:
		return fmt.Errorf("%w: advance %q with negative fence %d", ErrInvalid, resource, fence)
	}
	res, err := x.ExecContext(ctx, g.sql.advance, resource, fence)
	if err != nil {
		return fmt.Errorf("fencesql: advance %q to fence %d: %w", resource, fence, err)
	}
	ok, recorded, err := g.dialect.advanced(res, fence)
	if err != nil {
		return fmt.Errorf("fencesql: advance %q to fence %d: %w", resource, fence, err)
	}
	if ok {
		return nil
	}
	if q, can := x.(rowQueryer); can && recorded == 0 {
		// The row is locked by this transaction: the fence read is the one
		// that refused this holder. A failed read only leaves it unnamed.
		_ = q.QueryRowContext(ctx, g.sql.read, resource).Scan(&recorded)
	}
	return &StaleError{Resource: resource, Fence: fence, Recorded: recorded}
}
