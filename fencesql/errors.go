package fencesql

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with errors.Is: the errors of this package wrap
// them. An error from the database itself (a dropped connection, a deadlock,
// a serialization failure) matches none of them and wraps the driver's error.
var (
	// ErrStale means a holder with a greater fence has already written the
	// resource: this holder lost its lock, and the writes of its transaction
	// must not land. Advance returns it as a *StaleError.
	ErrStale = errors.New("fencesql: stale fence")

	// ErrNoFence means Advance was given fence 0, the fence of a degraded
	// (fail-open) lease, which holds no lock: nothing was sent to the
	// database. A degraded run relies on Once, a unique key or a conditional
	// update instead (see the package documentation).
	ErrNoFence = errors.New("fencesql: no fence (a degraded lease)")

	// ErrDone means Once found its key recorded by a committed transaction:
	// the work it names was done before.
	ErrDone = errors.New("fencesql: done before")

	// ErrInvalid means an argument was rejected before any SQL was sent:
	// an empty, over-long or non-UTF-8 resource or key, a negative fence, a
	// table name that is not a plain identifier, an unknown Dialect, or a
	// Prune age under a microsecond.
	ErrInvalid = errors.New("fencesql: invalid argument")
)

// A StaleError is Advance's error when a greater fence than this holder's is
// recorded for the resource. It matches ErrStale.
type StaleError struct {
	Resource string // the resource Advance was called for
	Fence    int64  // this holder's fence
	Recorded int64  // the greater fence recorded; 0 when it could not be read (see Advance)
}

func (e *StaleError) Error() string {
	if e.Recorded == 0 {
		return fmt.Sprintf("%v: %q has a fence newer than this holder's %d recorded", ErrStale, e.Resource, e.Fence)
	}
	return fmt.Sprintf("%v: %q has fence %d recorded, newer than this holder's %d", ErrStale, e.Resource, e.Recorded, e.Fence)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }
