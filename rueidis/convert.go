package fencerueidis

import (
	"encoding"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// A redisError is an error reply of the server, as fencelock's internal
// packages read them (a RedisError method, the server's message). It wraps
// rueidis's *RedisError.
type redisError struct {
	msg string
	err *rueidis.RedisError
}

func (e *redisError) Error() string { return e.msg }
func (e *redisError) RedisError()   {}
func (e *redisError) Unwrap() error { return e.err }

// newRedisError returns the error reply e with the server's message: rueidis
// trims the "ERR " of "-ERR ..." (for kvrocks), which fencelock reads (a
// script's error on Redis before 7 names its inner code after it). Every
// error reply of Redis starts with an upper-case code, so a message that
// does not had "ERR " before it.
func newRedisError(e *rueidis.RedisError) *redisError {
	msg := e.Error()
	if !startsWithCode(msg) {
		msg = "ERR " + msg
	}
	return &redisError{msg: msg, err: e}
}

func startsWithCode(msg string) bool {
	code, _, _ := strings.Cut(msg, " ")
	if code == "" {
		return false
	}
	for _, r := range code {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-' {
			return false
		}
	}
	return true
}

// translate gives rueidis's errors their meaning for a lock (see
// store.ClassOf): an error reply is a redisError, a closed client a refusal
// that sent nothing, and a context's error passes unchanged.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		return newRedisError(re)
	}
	if errors.Is(err, rueidis.ErrClosing) {
		return &store.Refusal{Msg: "the rueidis client is closed", Err: err, NotSent: true}
	}
	return err
}

// result returns a command's reply as go-redis's Do gives it: integers as
// int64, strings as string, arrays as []any, maps as map[any]any, a nil
// reply as nil; an error reply as a redisError.
func result(r rueidis.RedisResult) (any, error) {
	if err := r.NonRedisError(); err != nil {
		return nil, translate(err)
	}
	msg, err := r.ToMessage()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, nil
		}
		return nil, translate(err)
	}
	return value(&msg)
}

// value converts one reply, or an element of one: an error element is a
// redisError value, as go-redis gives it.
func value(m *rueidis.RedisMessage) (any, error) {
	switch {
	case m.IsNil():
		return nil, nil
	case m.IsInt64():
		return m.AsInt64()
	case m.IsString():
		return m.ToString()
	case m.IsArray():
		items, err := m.ToArray()
		if err != nil {
			return nil, translate(err)
		}
		out := make([]any, len(items))
		for i := range items {
			if e := items[i].Error(); e != nil && !rueidis.IsRedisNil(e) {
				out[i] = translate(e)
				continue
			}
			if out[i], err = value(&items[i]); err != nil {
				return nil, err
			}
		}
		return out, nil
	case m.IsMap():
		items, err := m.AsMap()
		if err != nil {
			return nil, translate(err)
		}
		out := make(map[any]any, len(items))
		for k, v := range items {
			if e := v.Error(); e != nil && !rueidis.IsRedisNil(e) {
				out[k] = translate(e)
				continue
			}
			if out[k], err = value(&v); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if err := m.Error(); err != nil {
		return nil, translate(err)
	}
	v, err := m.ToAny() // a double, a boolean, a verbatim string, a big number
	if s, ok := v.(string); ok && !m.IsString() && len(s) >= 4 && s[3] == ':' {
		return s[4:], nil // a verbatim string's format, which go-redis drops too
	}
	return v, translate(err)
}

// arg returns a command's argument in its Redis form, as go-redis writes it.
func arg(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	case int8:
		return strconv.FormatInt(int64(v), 10)
	case int16:
		return strconv.FormatInt(int64(v), 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint:
		return strconv.FormatUint(uint64(v), 10)
	case uint8:
		return strconv.FormatUint(uint64(v), 10)
	case uint16:
		return strconv.FormatUint(uint64(v), 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 32)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		if v {
			return "1"
		}
		return "0"
	case nil:
		return ""
	case time.Duration:
		return strconv.FormatInt(int64(v), 10)
	case time.Time:
		return v.Format(time.RFC3339Nano)
	case encoding.BinaryMarshaler:
		if b, err := v.MarshalBinary(); err == nil {
			return string(b)
		}
	case fmt.Stringer:
		return v.String()
	}
	return fmt.Sprint(a)
}

func strs(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = arg(a)
	}
	return out
}

// keyless are the commands fencelock sends that name no key: a Cluster's
// client sends them to any node.
var keyless = map[string]bool{
	"PING": true, "INFO": true, "TIME": true, "CONFIG": true, "CLUSTER": true, "PUBSUB": true,
	"ASKING": true, "COMMAND": true, "WAIT": true, "WAITAOF": true, "MULTI": true, "EXEC": true,
	"DISCARD": true, "SCAN": true, "SELECT": true, "ECHO": true, "HELLO": true, "AUTH": true,
	"CLIENT": true, "SCRIPT": true, "ROLE": true, "DBSIZE": true, "READONLY": true, "READWRITE": true,
	"PUBLISH": true, "FLUSHALL": true, "FLUSHDB": true, "ACL": true, "MEMORY": true, "LASTSAVE": true,
}

// build returns args as a rueidis command, with the slot of its first key
// (EVAL's and EVALSHA's first in KEYS; the first argument of other commands
// but the keyless ones) for a Cluster's routing; key is that key, or "" with
// keyed false. Each argument goes into the command as it is converted: no
// slice of them is made on the way.
func build(b rueidis.Builder, args []any) (cmd rueidis.Completed, key string, keyed bool) {
	first := arg(args[0])
	at := -1
	switch name := strings.ToUpper(first); name {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
		if len(args) > 3 {
			if n, err := strconv.Atoi(arg(args[2])); err == nil && n > 0 {
				at = 3
			}
		}
	default:
		if !keyless[name] && len(args) > 1 {
			at = 1
		}
	}
	a := b.Arbitrary(first)
	for i := 1; i < len(args); i++ {
		if i == at {
			key = arg(args[i])
			a = a.Keys(key)
		} else {
			a = a.Args(arg(args[i]))
		}
	}
	return a.Build(), key, at >= 0
}

// evalCmd returns the command that runs s on keys with argv, as
// build(b, script.Args(s, eval, keys, argv)) does, without the slice of
// arguments: EVALSHA (EVAL with eval), routed by the first key.
func evalCmd(b rueidis.Builder, s *script.Script, eval bool, keys, argv []any) rueidis.Completed {
	name, body := "EVALSHA", s.Hash
	if eval {
		name, body = "EVAL", s.Src
	}
	a := b.Arbitrary(name, arg(body), strconv.Itoa(len(keys)))
	for i, k := range keys {
		if i == 0 {
			a = a.Keys(arg(k))
		} else {
			a = a.Args(arg(k))
		}
	}
	for _, v := range argv {
		a = a.Args(arg(v))
	}
	return a.Build()
}
