package store

import (
	"errors"
	"strconv"
	"time"
)

// The replies the scripts share: each kind's extend and release scripts
// answer as extend.lua and release.lua do.

// ExtendReply decodes the reply of the extend script called script, given
// its run's error: WAIT's, with a reply, stands only when the expiry was
// set (or the reply is not understood).
func ExtendReply(script string, reply any, err error) (Result, error) {
	if err != nil && reply == nil {
		return Gone, err
	}
	code, ok := reply.(int64)
	ok = ok && code >= -1 && code <= 1
	switch {
	case err != nil && (!ok || code == 1):
		return Gone, err // set (or unknown), but too few replicas have it
	case !ok:
		return Gone, BadReply(script, reply)
	}
	return result(code), nil
}

// ReleaseReply decodes a release script's reply: 1, 0 or -1, or {1, error}
// when the wake-up could not be published (perr).
func ReleaseReply(script string, reply any) (r Result, perr, err error) {
	switch v := reply.(type) {
	case int64:
		if v >= -1 && v <= 1 {
			return result(v), nil, nil
		}
	case []any:
		if len(v) == 2 {
			msg, _ := v[1].(string)
			if c, _ := v[0].(int64); c == 1 {
				return Done, errors.New(OneLine(msg)), nil
			}
		}
	}
	return Gone, nil, BadReply(script, reply)
}

// result is the Result of a script's code, -1, 0 or 1.
func result(code int64) Result { return [...]Result{Taken, Gone, Done}[code+1] }

// Millis returns d in milliseconds for a script's ARGV, rounded up: a lock
// never lives shorter than asked.
func Millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Drift is the clock drift allowance of a lease of ttl: its holder counts
// on ttl less this from when its request was sent.
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// AcquireReply is the attempt of the reply of script, which answers as
// acquire.lua does: {1, fence}, {0, pttl, owner} or {2}.
func AcquireReply(script string, reply any) Attempt {
	arr, _ := reply.([]any)
	var flag int64 = -1
	if len(arr) > 0 {
		flag, _ = arr[0].(int64)
	}
	switch {
	case flag == 0 && len(arr) == 3:
		pttl, isInt := arr[1].(int64)
		owner, isStr := arr[2].(string)
		if isInt && isStr && pttl == -3 {
			return Attempt{Busy: Busy{TTL: -3, Owner: "fair waiters in line"}}
		}
		if isInt && isStr {
			return Attempt{Busy: Busy{TTL: time.Duration(pttl) * time.Millisecond, Owner: owner}}
		}
	case flag == 1 && len(arr) == 2:
		s, isStr := arr[1].(string)
		fence, err := strconv.ParseInt(s, 10, 64)
		if isStr && err == nil && fence > 0 {
			return Attempt{OK: true, Fence: fence}
		}
	case flag == 2 && len(arr) == 1:
		return Attempt{Err: ErrRetired}
	}
	return Attempt{Err: BadReply(script, reply)}
}

// ErrRetired is an acquire script's refusal of a retired token: only a
// late copy of an attempt meets it.
var ErrRetired = errors.New("the acquisition was given up")

// ModeArg returns mode boxed from its constant: boxing the variable would
// allocate.
func ModeArg(mode Mode) any {
	if mode == Release {
		return string(Release)
	}
	return string(Abandon)
}

// InspectReply decodes inspect.lua's reply: {value, pttl, counter}.
func InspectReply(reply any) (Holding, error) {
	arr, _ := reply.([]any)
	if len(arr) != 3 {
		return Holding{}, BadReply("inspect", reply)
	}
	value, ok1 := arr[0].(string)
	pttl, ok2 := arr[1].(int64)
	counter, ok3 := arr[2].(string)
	if !ok1 || !ok2 || !ok3 {
		return Holding{}, BadReply("inspect", reply)
	}
	h := Holding{Value: value, PTTL: time.Duration(pttl) * time.Millisecond}
	if pttl < 0 {
		h.PTTL = -1
	}
	h.Counter, _ = strconv.ParseInt(counter, 10, 64)
	return h, nil
}
