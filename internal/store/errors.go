package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Class is what a failed Redis call means for a lock.
type Class int8

const (
	// Unavailable: not reached, no answer, or a transient state.
	Unavailable Class = iota
	// Misconfigured: Redis answered and refuses, or the client cannot be
	// used: retrying does not help.
	Misconfigured
	// NoVerdict: the caller's context ended first.
	NoVerdict
)

// transient are the codes of a Redis that answers but cannot serve a lock
// right now.
var transient = map[string]bool{
	"LOADING": true, "BUSY": true, "READONLY": true, "MASTERDOWN": true,
	"CLUSTERDOWN": true, "TRYAGAIN": true, "NOREPLICAS": true, "OOM": true,
}

// ClassOf tells what err, returned by a store's call, means: the class of
// an error in its chain that has one (a Class method), NoVerdict for a
// context's own error, Misconfigured for a Redis error reply that is not
// transient and for a reply that cannot be read (ErrReply), Unavailable
// otherwise.
func ClassOf(err error) Class {
	var c interface{ Class() Class }
	if errors.As(err, &c) {
		return c.Class()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		var op *net.OpError
		if !errors.As(err, &op) { // a context's own error, not a network timeout
			return NoVerdict
		}
	}
	var rerr interface {
		error
		RedisError()
	}
	if errors.As(err, &rerr) {
		if transient[Code(rerr.Error())] {
			return Unavailable
		}
		return Misconfigured
	}
	if errors.Is(err, ErrReply) {
		return Misconfigured
	}
	return Unavailable
}

// ErrReply marks a reply a store cannot decode: not a Redis it can work
// with.
var ErrReply = errors.New("unexpected reply")

// BadReply returns the error of a reply of the named script that cannot be
// decoded.
func BadReply(script string, reply any) error {
	return fmt.Errorf("%w from the %s script: %v", ErrReply, script, reply)
}

// Code returns a Redis error's code: its first word, or, for an error
// raised inside a script on Redis before 7 ("ERR Error running script ...:
// @user_script:17: WRONGTYPE ..."), the code of the error the script met.
func Code(msg string) string {
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

// A Refusal is an error of class Misconfigured whose message says what to
// fix: a client that cannot be used, a refusal a store found.
type Refusal struct {
	Msg     string
	Err     error // the client's, if any
	NotSent bool  // the command was not sent (a closed client)
}

func (e *Refusal) Error() string { return e.Msg }
func (e *Refusal) Unwrap() error { return e.Err }

// Class returns Misconfigured.
func (e *Refusal) Class() Class { return Misconfigured }

// Unsent reports whether the command was not sent.
func (e *Refusal) Unsent() bool { return e.NotSent }

// Unsent reports whether err shows that a command never reached Redis: an
// error in its chain says so (an Unsent method), or the connection could
// not be made. A client returns the error of its last try, so a command
// written by an earlier try of the same call, before the server became
// unreachable, counts as not sent; the server then was going away, and a
// lock it took expires after its TTL.
func Unsent(err error) bool {
	var u interface{ Unsent() bool }
	if errors.As(err, &u) {
		return u.Unsent()
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// NotSent is an error that never reached Redis: its Unsent reports true.
type NotSent struct{ Err error }

func (e *NotSent) Error() string { return e.Err.Error() }
func (e *NotSent) Unwrap() error { return e.Err }

// Unsent returns true.
func (e *NotSent) Unsent() bool { return true }

// Timeout reports whether err is a timeout: when the caller's context has
// ended, that is the context cutting the call short, not a verdict of
// Redis.
func Timeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// OneLine replaces line breaks, which break line-based logs.
func OneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// A ReplicaError is an acquisition or extension that fewer replicas than
// asked acknowledged (WAIT, or WAITAOF with Fsync) within Timeout: of
// class Unavailable.
type ReplicaError struct {
	Acked   int64
	Want    int
	Local   int64 // WAITAOF: whether the master fsynced it
	Fsync   bool
	Timeout time.Duration
}

func (e *ReplicaError) Error() string {
	what := "acknowledged"
	if e.Fsync {
		what = "wrote it to disk"
		if e.Local < 1 {
			return fmt.Sprintf("the master did not write the lock to disk, %d of %d replicas did, within ReplicaTimeout %v",
				e.Acked, e.Want, e.Timeout)
		}
	}
	return fmt.Sprintf("%d of %d replicas %s within ReplicaTimeout %v", e.Acked, e.Want, what, e.Timeout)
}

// Class returns Unavailable.
func (e *ReplicaError) Class() Class { return Unavailable }

// ReplicaShort reports whether err is a ReplicaError.
func ReplicaShort(err error) bool {
	var short *ReplicaError
	return errors.As(err, &short)
}
