// Package script holds fencelock's Lua scripts, one .lua file each, and runs
// them: EVALSHA, then EVAL when the server does not have the script. Every
// key a script touches is in KEYS, and a lock's keys share its hash tag. A
// script as sent is its file after the functions it calls of the prelude
// files (prelude.lua, line_prelude.lua, a kind's own; see assemble_test.go).
package script

import (
	"context"
	"embed"
	"errors"
	"strings"
)

// A Script is one of the library's Lua scripts.
type Script struct {
	Name      string // the file's, without ".lua"
	Src, Hash any    // the source and its SHA-1, as strings boxed once for the commands' arguments
}

// The scripts as sent are generated from the .lua files into assembled/,
// their SHA-1s into hashes.go (crypto/sha1 panics in FIPS 140-only mode);
// TestAssembled checks both, and writes them for go generate.
//
//go:generate go test -run TestAssembled . -update

// All are the library's scripts.
var All []*Script

var (
	Acquire = load("acquire")
	Release = load("release")
	Extend  = load("extend")
	Queue   = load("queue")
	Inspect = load("inspect")

	RedlockGrant   = load("redlock_grant")
	RedlockRelease = load("redlock_release")
	RedlockFence   = load("redlock_fence")

	MultiAcquire = load("multi_acquire")

	SemAcquire = load("semaphore_acquire")
	SemExtend  = load("semaphore_extend")
	SemRelease = load("semaphore_release")
	SemQueue   = load("semaphore_queue")
	SemInspect = load("semaphore_inspect")

	RWRead    = load("rwlock_read")
	RWWrite   = load("rwlock_write")
	RWExtend  = load("rwlock_extend")
	RWRelease = load("rwlock_release")
	RWInspect = load("rwlock_inspect")
)

//go:embed assembled
var assembled embed.FS

func load(name string) *Script {
	src, err := assembled.ReadFile("assembled/" + name + ".lua")
	if err != nil {
		panic("script: " + err.Error() + ": run go generate ./internal/script")
	}
	s := &Script{Name: name, Src: string(src), Hash: hashes[name]}
	All = append(All, s)
	return s
}

// Args returns the arguments of EVALSHA running s, or EVAL with eval.
func Args(s *Script, eval bool, keys, argv []any) []any {
	args := make([]any, 0, 3+len(keys)+len(argv))
	if eval {
		args = append(args, "eval", s.Src)
	} else {
		args = append(args, "evalsha", s.Hash)
	}
	args = append(args, len(keys))
	args = append(args, keys...)
	return append(args, argv...)
}

// A Caller sends one command and returns its reply: an error reply as an
// error with a RedisError method.
type Caller interface {
	Call(ctx context.Context, args []any) (any, error)
}

// Run runs s on c: EVALSHA, then EVAL when the server does not have it
// cached (NOSCRIPT), or EVAL alone when eval is set.
func Run(ctx context.Context, c Caller, s *Script, eval bool, keys, argv []any) (any, error) {
	reply, err := c.Call(ctx, Args(s, eval, keys, argv))
	if !eval && err != nil && IsNoScript(err) {
		reply, err = c.Call(ctx, Args(s, true, keys, argv))
	}
	return reply, err
}

// IsNoScript reports whether err is a NOSCRIPT reply.
func IsNoScript(err error) bool {
	var rerr interface {
		error
		RedisError()
	}
	return errors.As(err, &rerr) && strings.HasPrefix(strings.TrimPrefix(rerr.Error(), "ERR "), "NOSCRIPT")
}
