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
	Unavailable   Class = iota // not reached, no answer, or a transient state
	Misconfigured              // Redis refuses, or the client cannot be used: retrying does not help
	NoVerdict                  // the caller's context ended first
)

// transient are the codes of a Redis that cannot serve a lock right now.
var transient = map[string]bool{
	"LOADING": true, "BUSY": true, "READONLY": true, "MASTERDOWN": true,
	"CLUSTERDOWN": true, "TRYAGAIN": true, "NOREPLICAS": true, "OOM": true,
}

// ClassOf tells what err, of a store's call, means: the class of an error
// in its chain that has a Class method, NoVerdict for a context's own error,
// Misconfigured for a Redis error reply that is not transient and for
// ErrReply, Unavailable otherwise.
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
	if errors.As(err, &rerr) && !transient[Code(rerr.Error())] || errors.Is(err, ErrReply) {
		return Misconfigured
	}
	return Unavailable
}

// ErrReply marks a reply a store cannot decode: not a Redis it can work with.
var ErrReply = errors.New("unexpected reply")

// BadReply returns the error of the named script's reply it cannot decode.
func BadReply(script string, reply any) error {
	return fmt.Errorf("%w from the %s script: %v", ErrReply, script, reply)
}

// Code returns a Redis error's code: its first word, or, inside a script
// on Redis before 7 ("ERR ... @user_script:17: WRONGTYPE ..."), the code of
// the error the script met.
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
// fix.
type Refusal struct {
	Msg     string
	Err     error // the client's, if any
	NotSent bool  // the command was not sent (a closed client)
}

func (e *Refusal) Error() string { return e.Msg }
func (e *Refusal) Unwrap() error { return e.Err }
func (e *Refusal) Class() Class  { return Misconfigured }
func (e *Refusal) Unsent() bool  { return e.NotSent }

// Unsent reports whether err shows that a command never reached Redis: an
// error in its chain says so (an Unsent method), or a dial failed. A client
// returns its last try's error, so a command an earlier try wrote before
// the server became unreachable counts as not sent: a lock it took there
// expires after its TTL.
func Unsent(err error) bool {
	var u interface{ Unsent() bool }
	if errors.As(err, &u) {
		return u.Unsent()
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// NotSent is the error of a command that never reached Redis.
type NotSent struct{ Err error }

func (e *NotSent) Error() string { return e.Err.Error() }
func (e *NotSent) Unwrap() error { return e.Err }
func (e *NotSent) Unsent() bool  { return true }

// Timeout reports whether err is a timeout: once the caller's context has
// ended, its cut, not a verdict of Redis.
func Timeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// IsUnknownCommand reports whether err is Redis refusing a command or a
// subcommand it does not know (sharded pub/sub before Redis 7), whichever
// client sent it.
func IsUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}

// OneLine replaces line breaks.
func OneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// A ReplicaError is a write fewer replicas than asked acknowledged (WAIT,
// or WAITAOF with Fsync) within Timeout: of class Unavailable.
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

func (e *ReplicaError) Class() Class { return Unavailable }

// ReplicaShort reports whether err is a ReplicaError.
func ReplicaShort(err error) bool {
	var short *ReplicaError
	return errors.As(err, &short)
}
