package fencelock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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

// errReleased is the cause of a KeepAlive context cancelled by Release.
var errReleased = fmt.Errorf("%w: lease released", ErrNotHeld)

// Why a lease is not held, as Redis told it.
var (
	errGone     = fmt.Errorf("%w: the lock expired or was deleted", ErrNotHeld)
	errTakenBy  = fmt.Errorf("%w: the lock is held by another holder", ErrNotHeld)
	errReleaseD = fmt.Errorf("%w: released already", ErrNotHeld)
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// An opError is an error of this package with a one-line message of its own
// that matches several errors (a sentinel, its cause, a context's error):
// errors.Join would put them on separate lines.
type opError struct {
	msg  string
	errs []error
}

func (e *opError) Error() string   { return e.msg }
func (e *opError) Unwrap() []error { return e.errs }

// withCtx adds the caller's context error to err: the result matches both,
// on one line.
func withCtx(err, ctxErr error) error {
	if err == nil || ctxErr == nil {
		return err
	}
	return &opError{msg: err.Error() + "; " + ctxErr.Error(), errs: []error{err, ctxErr}}
}

// ctxEnded is the error of a call whose context ended before Redis gave any
// verdict: it matches ctx's error (and its cause) and no sentinel of this
// package.
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

// errClass is what a failed Redis call means for the lock.
type errClass int

const (
	classUnavailable   errClass = iota // not reached, no answer, or a transient state
	classMisconfigured                 // Redis answered and refuses
	classNoVerdict                     // the caller's context ended first
)

// transient are the codes of a Redis that answers but cannot serve the lock
// right now (see ErrUnavailable).
var transient = map[string]bool{
	"LOADING": true, "BUSY": true, "READONLY": true, "MASTERDOWN": true,
	"CLUSTERDOWN": true, "TRYAGAIN": true, "NOREPLICAS": true, "OOM": true,
}

// classify tells what err, returned by a Redis call, means.
func classify(err error) errClass {
	var qe *quorumError
	if errors.As(err, &qe) {
		return qe.class
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		var op *net.OpError
		if !errors.As(err, &op) { // a context's own error, not a network timeout
			return classNoVerdict
		}
	}
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, ErrMisconfigured) {
		return classMisconfigured // a closed client; a refusal this package found (a Semaphore's permits)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if transient[errCode(rerr.Error())] {
			return classUnavailable
		}
		return classMisconfigured
	}
	if errors.Is(err, errReply) {
		return classMisconfigured
	}
	return classUnavailable
}

// errReply marks a reply this package cannot decode: not a Redis it can
// work with.
var errReply = errors.New("unexpected reply")

// errCode returns a Redis error's code: its first word, or, for an error
// raised inside a script on Redis before 7 ("ERR Error running script ...:
// @user_script:17: WRONGTYPE ..."), the code of the error the script met.
func errCode(msg string) string {
	code, rest, _ := strings.Cut(msg, " ")
	if code == "ERR" {
		if i := strings.Index(rest, "@user_script:"); i >= 0 {
			rest = rest[i+len("@user_script:"):]
			if _, after, ok := strings.Cut(rest, ": "); ok {
				inner, _, _ := strings.Cut(after, " ")
				if inner == strings.ToUpper(inner) && inner != "" {
					return inner
				}
			}
		}
	}
	return code
}

// callError turns the error of a Redis call for the lock named name into
// one of this package's: ErrUnavailable or ErrMisconfigured, with a one-line
// message. It is not used for errors of class classNoVerdict.
func callError(name string, err error) error {
	if errors.Is(err, ErrMisconfigured) {
		return err // its message is already this package's
	}
	if classify(err) == classMisconfigured {
		return &opError{msg: ErrMisconfigured.Error() + ": " + advice(name, err), errs: []error{ErrMisconfigured, err}}
	}
	return &opError{msg: ErrUnavailable.Error() + ": " + oneLine(err.Error()), errs: []error{ErrUnavailable, err}}
}

// advice describes a refusal and what to change, without the script's
// internals (its SHA and line numbers).
func advice(name string, err error) string {
	if errors.Is(err, redis.ErrClosed) {
		return "the go-redis client is closed"
	}
	if errors.Is(err, errReply) {
		return oneLine(err.Error()) + ": is this a Redis server (6.2 or later)?"
	}
	msg := oneLine(err.Error())
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
	if strings.Contains(msg, "Protocol error: unauthenticated") {
		// Redis (7.0.x and later) refuses a long command (the scripts' EVALSHA
		// has more than 10 arguments) from a client that did not log in
		// with this, before it would say NOAUTH.
		return "NOAUTH: the server requires a password and refused a command before login (" + msg +
			"): set Password (and Username) in the go-redis options"
	}
	code := errCode(err.Error())
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

// oneLine replaces line breaks, which break line-based logs.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// isTimeout reports whether err is a timeout: when the caller's context has
// ended, that is the context cutting the call short, not a verdict of Redis.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// notSent reports whether err shows that the command never reached Redis:
// the connection could not be made. go-redis returns the error of its last
// try, so a command written by an earlier try of the same call, before the
// server became unreachable, counts as not sent; the server then was going
// away, and a lock it took expires after its TTL.
func notSent(err error) bool {
	var nr *noReplyError
	if errors.As(err, &nr) { // a dial error as its cause proves nothing on a quorum
		return nr.unsent
	}
	var qe *quorumError
	if errors.As(err, &qe) { // not sent to any node
		for _, e := range qe.errs {
			if !notSent(e) {
				return false
			}
		}
		return len(qe.errs) > 0
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
