package fencelock

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with errors.Is: the errors returned by this package
// wrap them, usually together with a cause.
var (
	// ErrNotObtained means the lock is busy: another holder has it, and either
	// Acquire was asked to try once or its wait ran out. When the caller's
	// context ended first, the error also matches ctx.Err().
	ErrNotObtained = errors.New("fencelock: not obtained")

	// ErrNotHeld means the lock is no longer held by this lease: it expired,
	// was taken over by another holder, was deleted, or was released already.
	ErrNotHeld = errors.New("fencelock: not held")

	// ErrUnavailable means Redis could not be reached, answered with an
	// error, or did not answer before the caller's deadline. The error wraps
	// the cause. The state of the lock is unknown to the caller; see each
	// method for what it leaves behind.
	ErrUnavailable = errors.New("fencelock: redis unavailable")

	// ErrInvalid means an argument or option was rejected before any Redis
	// call was made.
	ErrInvalid = errors.New("fencelock: invalid argument")

	// ErrLost means a lease was lost while its work ran: the lock was taken
	// over or deleted, or its local deadline passed before a renewal
	// succeeded. Mutual exclusion may have been broken; only the fencing
	// token protects the resource from here on. It is the cause of the
	// cancelled work context (context.Cause) and part of RunWithLock's
	// error.
	ErrLost = errors.New("fencelock: lease lost")
)

// errReleased is the cause of a KeepAlive context cancelled by Release.
var errReleased = fmt.Errorf("%w: lease released", ErrNotHeld)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func unavailable(cause error) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, cause)
}
