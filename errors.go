package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/store"
)

// Sentinel errors, to match with errors.Is; the package's errors wrap them in
// one line. No error matches two of ErrNotObtained, ErrUnavailable and
// ErrMisconfigured; one from a ctx that ended before Redis gave any verdict
// matches ctx.Err() and no sentinel.
var (
	// ErrNotObtained means the lock is busy (a *BusyError says who), and
	// Acquire tried once or its wait ran out.
	ErrNotObtained = errors.New("fencelock: not obtained")
	// ErrNotHeld means the lock is no longer this lease's (the text says why).
	ErrNotHeld = errors.New("fencelock: not held")
	// ErrUnavailable means Redis was unreachable, did not answer in time, or
	// answered with a transient state (LOADING, BUSY, READONLY, MASTERDOWN,
	// CLUSTERDOWN, TRYAGAIN, NOREPLICAS, OOM): the lock's state is unknown.
	ErrUnavailable = errors.New("fencelock: redis unavailable")
	// ErrMisconfigured means Redis refuses the lock's commands (NOAUTH, WRONGPASS,
	// NOPERM, WRONGTYPE, an unknown command, a fence counter at its maximum, a
	// closed go-redis client): retrying does not help; the text says the fix.
	ErrMisconfigured = errors.New("fencelock: redis refuses the lock's commands")
	// ErrInvalid means an argument or option was rejected before any Redis call.
	ErrInvalid = errors.New("fencelock: invalid argument")
	// ErrLost means a lease was lost while its work ran: exclusion may have been broken,
	// and only the fence protects the data.
	ErrLost = errors.New("fencelock: lease lost")
	// ErrClosed means the Locker was closed; it matches no other sentinel.
	ErrClosed = errors.New("fencelock: locker closed")
)

// A BusyError is the error of an Acquire that found the lock held by
// another: it matches ErrNotObtained, and says who holds it and for how long.
type BusyError struct {
	Name    string        // the lock's name
	Owner   string        // the holder's Options.Owner or WithOwner; "" if it stored none
	TTL     time.Duration // left when Redis answered; -1: no expiry; other negative values: free, but others are served first
	Holders int           // a Semaphore's: how many hold permits (Owner, TTL: the first to expire); 0 for a lock
}

func (e *BusyError) Error() string {
	holder := e.Owner
	if holder == "" {
		holder = "another holder"
	}
	left := " for " + e.TTL.Round(100*time.Millisecond).String() + " more"
	switch {
	case e.TTL == -1:
		left = " with no expiry"
	case e.TTL < 0:
		return fmt.Sprintf("%s: %q is free, but %s are served first", ErrNotObtained.Error(), e.Name, holder)
	case e.TTL < 100*time.Millisecond:
		left = " for " + e.TTL.String() + " more"
	}
	if e.Holders > 0 { // a Semaphore's: left is of the first permit to expire
		return fmt.Sprintf("%s: all %d permits of %q are held, the first by %s%s",
			ErrNotObtained.Error(), e.Holders, e.Name, holder, left)
	}
	return fmt.Sprintf("%s: %q held by %s%s", ErrNotObtained.Error(), e.Name, holder, left)
}

// Is reports whether target is ErrNotObtained.
func (e *BusyError) Is(target error) bool { return target == ErrNotObtained }

// Why a lease is not held: released (a KeepAlive context's cause), or as Redis told it.
var (
	errReleased = fmt.Errorf("%w: lease released", ErrNotHeld)
	errGone     = fmt.Errorf("%w: the lock expired or was deleted", ErrNotHeld)
	errTakenBy  = fmt.Errorf("%w: the lock is held by another holder", ErrNotHeld)
	errReleaseD = fmt.Errorf("%w: released already", ErrNotHeld)
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// An opError matches several errors with a one-line message (errors.Join's has several).
type opError struct {
	msg  string
	errs []error
}

func (e *opError) Error() string   { return e.msg }
func (e *opError) Unwrap() []error { return e.errs }

// withCtx adds the caller's context error to err, matching both.
func withCtx(err, ctxErr error) error {
	if err == nil || ctxErr == nil {
		return err
	}
	return &opError{msg: err.Error() + "; " + ctxErr.Error(), errs: []error{err, ctxErr}}
}

// ctxEnded is the error of a call ended by ctx before any verdict: no sentinel.
func ctxEnded(ctx context.Context, what string) error {
	err := ctx.Err()
	if err == nil {
		err = context.DeadlineExceeded // the deadline passed, its timer has not fired yet
	}
	errs := []error{err}
	msg := "fencelock: " + what + ": " + err.Error()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		errs = append(errs, cause)
		msg += ": " + cause.Error()
	}
	return &opError{msg: msg, errs: errs}
}

// classify tells what err, a store's or this package's, means.
func classify(err error) store.Class {
	switch {
	case errors.Is(err, ErrMisconfigured):
		return store.Misconfigured // a refusal this package found (a Semaphore's permits)
	case errors.Is(err, ErrUnavailable):
		return store.Unavailable
	}
	return store.ClassOf(err)
}

// callError turns a Redis call's error (not NoVerdict) into one of this package's.
func callError(name string, err error) error {
	if errors.Is(err, ErrMisconfigured) {
		return err // its message is already this package's
	}
	if classify(err) == store.Misconfigured {
		return &opError{msg: ErrMisconfigured.Error() + ": " + advice(name, err), errs: []error{ErrMisconfigured, err}}
	}
	return &opError{msg: ErrUnavailable.Error() + ": " + store.OneLine(err.Error()), errs: []error{ErrUnavailable, err}}
}

// advice describes a refusal and what to change, without the script's internals.
func advice(name string, err error) string {
	var refusal *store.Refusal
	if errors.As(err, &refusal) {
		return refusal.Msg
	}
	if errors.Is(err, store.ErrReply) {
		return store.OneLine(err.Error()) + ": is this a Redis server (6.2 or later)?"
	}
	msg := store.OneLine(err.Error())
	if i := strings.Index(msg, " script: "); i >= 0 { // Redis 7: "... script: <sha>, on @user_script:17."
		msg = msg[:i]
	}
	if i := strings.Index(msg, "Error running script"); i >= 0 { // Redis 6
		if j := strings.Index(msg, "@user_script:"); j >= 0 {
			if _, after, ok := strings.Cut(msg[j:], ": "); ok {
				msg = after
			}
		}
	}
	if i := strings.Index(msg, ", with args beginning with"); i >= 0 { // the arguments: a SHA, keys, the token
		msg = msg[:i]
	}
	if i := strings.Index(msg, "user_script:"); i >= 0 { // a Lua error's location: "ERR user_script:1: ..."
		if _, after, ok := strings.Cut(msg[i:], ": "); ok {
			msg = msg[:i] + after
		}
	}
	msg = strings.TrimSuffix(strings.TrimSpace(msg), ".")
	if strings.Contains(msg, "Protocol error: unauthenticated") { // Redis 7: a long command before login
		return "NOAUTH: the server requires a password and refused a command before login (" + msg +
			"): set Password (and Username) in the go-redis options"
	}
	code := store.Code(err.Error())
	if code == "ERR" && strings.Contains(msg, "The user executing the script can't") {
		code = "NOPERM" // Redis 7.0 names a script's refused command so
	}
	switch code {
	case "NOAUTH":
		return msg + ": set Password (and Username) in the go-redis options"
	case "WRONGPASS":
		return msg + ": check Username and Password in the go-redis options"
	case "NOPERM":
		return msg + ": " + aclAdvice()
	case "WRONGTYPE":
		return fmt.Sprintf("%s: a key of lock %q holds another type: delete it or use another KeyPrefix", msg, name)
	}
	if strings.Contains(msg, "increment or decrement would overflow") {
		return fmt.Sprintf("the fence counter of lock %q is at its maximum (%s): delete the counter key; "+
			"fences go on from the server's time", name, msg)
	}
	if lower := strings.ToLower(msg); strings.Contains(lower, "unknown command") {
		if strings.Contains(lower, "'waitaof'") { // sent for Options.ReplicaFsync only
			return msg + ": ReplicaFsync sends WAITAOF: WAITAOF needs Redis 7.2 or later, with appendonly yes on the master and its replicas"
		}
		return msg + ": fencelock needs Redis 6.2 or later with scripting enabled"
	}
	if strings.Contains(msg, "not an integer") {
		return fmt.Sprintf("%s: the fence counter of lock %q holds something else than a number: "+
			"delete it or use another KeyPrefix", msg, name)
	}
	return fmt.Sprintf("%s (in the script of lock %q)", msg, name)
}

// closedError is an Acquire ended by Close, naming but not matching verdict.
func closedError(name string, verdict error) error {
	msg := fmt.Sprintf("%s: acquire %q", ErrClosed.Error(), name)
	if verdict != nil {
		msg += " (last attempt: " + verdict.Error() + ")"
	}
	return &opError{msg: msg, errs: []error{ErrClosed}}
}

// A noReplyError is an attempt with no reply in time, matching the dial error, if any.
type noReplyError struct {
	timeout time.Duration
	half    bool // the bound was half the time left before the deadline, for fail-open
	cause   error
	unsent  bool // the script was provably not sent
}

func (e *noReplyError) Error() string {
	bound := "AttemptTimeout"
	if e.half {
		bound = "half the time left before the deadline, for fail-open"
	}
	msg := "no reply within " + e.timeout.Round(time.Millisecond).String() + " (" + bound + ")"
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *noReplyError) Unwrap() error { return e.cause }

// Unsent reports whether the attempt was provably not sent.
func (e *noReplyError) Unsent() bool { return e.unsent }

// busySeen is an Acquire's last busy answer, until when an outage does not fail open.
type busySeen struct {
	err   *BusyError
	until time.Time
}

// see records busy, an answer to the attempt sent at sent, and returns it.
func (b *busySeen) see(busy *BusyError, sent time.Time) error {
	b.err, b.until = busy, sent.Add(max(busy.TTL, 0))
	if busy.TTL == -1 { // no expiry
		b.until = sent.Add(forever)
	}
	return busy
}

// verdict is v, or the busy answer when v is an outage while it lasts.
func (b *busySeen) verdict(v error, now time.Time) error {
	if b.err != nil && now.Before(b.until) && errors.Is(v, ErrUnavailable) {
		return b.err
	}
	return v
}

// lostAtRelease is the loss of a lease found not held after the work.
func lostAtRelease(rerr error) error {
	return &opError{msg: ErrLost.Error() + ": not held when released after the work: " + rerr.Error(),
		errs: []error{ErrLost, rerr}}
}

// joinErr joins the work's error and a loss on one line; both match.
func joinErr(werr, lost error) error {
	if werr == nil {
		return lost
	}
	return &opError{msg: werr.Error() + "; " + lost.Error(), errs: []error{werr, lost}}
}

var errMaxHold = errors.New("held for MaxHold") // starts the cause of a lease no longer renewed

// lostBecause is the cause of a lease Redis found not held, matching ErrLost only.
func lostBecause(notHeld error) error {
	return &opError{msg: ErrLost.Error() + ": " + strings.TrimPrefix(notHeld.Error(), "fencelock: "),
		errs: []error{ErrLost}}
}

// deadlinePassed is the cause of a lease lost at its local deadline.
func deadlinePassed(lastErr error) error {
	if errors.Is(lastErr, errMaxHold) {
		return fmt.Errorf("%w: %w; its deadline passed", ErrLost, lastErr)
	}
	if lastErr != nil {
		return fmt.Errorf("%w: deadline passed before a renewal succeeded: %w", ErrLost, lastErr)
	}
	return fmt.Errorf("%w: deadline passed before a renewal succeeded", ErrLost)
}

// releaseCutShort is the error of a release that returned before Redis answered.
func (l *Locker) releaseCutShort(ctx context.Context) error {
	if ctxErr(ctx) != nil {
		return ctxEnded(ctx, "release (it goes on in the background)")
	}
	return &opError{msg: fmt.Sprintf("%s: no reply within ReleaseTimeout %v", ErrUnavailable.Error(), l.opts.ReleaseTimeout),
		errs: []error{ErrUnavailable}}
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if its timer has not fired yet (a call that honours the
// deadline may return first).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) { // real time, as ctx's deadline
		return context.DeadlineExceeded
	}
	return nil
}

// notHeld is the error of a store's result: nil for Done.
func notHeld(r store.Result) error {
	switch r {
	case store.Done:
		return nil
	case store.Taken:
		return errTakenBy
	}
	return errGone
}
