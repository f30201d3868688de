// Package script holds fencelock's Lua scripts, one .lua file each, and runs
// them: EVALSHA by a hash computed at build time (go generate), then EVAL
// when the server does not have the script cached. Every key a script
// touches is passed in KEYS, and all of a lock's keys share its hash tag.
//
// A script's source is its file after the functions it calls from
// prelude.lua (shared) and from its kind's own prelude file
// (semaphore_prelude.lua, rwlock_prelude.lua), all local to the script.
package script

import (
	"context"
	"embed"
	"errors"
	"regexp"
	"strings"
)

// A Script is one of the library's Lua scripts.
type Script struct {
	Name      string // the file's, without ".lua"
	Src, Hash any    // the source and its SHA-1, as strings boxed once for the commands' arguments
}

// The scripts' SHA-1s are constants (hashes, in hashes.go), never
// computed: in FIPS 140-only mode (GODEBUG=fips140=only) crypto/sha1
// panics. TestHashes checks them against the sources, and writes them anew
// for go generate.
//
//go:generate go test -run TestHashes . -update-hashes

// All are the library's scripts: the ones whose hashes hashes.go holds.
var All []*Script

// The scripts, by file.
var (
	Acquire = build("acquire", true)
	Release = build("release", true)
	Extend  = build("extend", true)
	Queue   = build("queue", true)
	Inspect = build("inspect", false)

	RedlockGrant   = build("redlock_grant", true)
	RedlockRelease = build("redlock_release", true)
	RedlockFence   = build("redlock_fence", true)

	MultiAcquire = build("multi_acquire", true)

	SemAcquire = build("semaphore_acquire", true, "semaphore_prelude")
	SemExtend  = build("semaphore_extend", true, "semaphore_prelude")
	SemRelease = build("semaphore_release", true, "semaphore_prelude")
	SemQueue   = build("semaphore_queue", true, "semaphore_prelude")
	SemInspect = build("semaphore_inspect", true, "semaphore_prelude")

	RWRead    = build("rwlock_read", true, "rwlock_prelude")
	RWWrite   = build("rwlock_write", true, "rwlock_prelude")
	RWExtend  = build("rwlock_extend", true, "rwlock_prelude")
	RWRelease = build("rwlock_release", true, "rwlock_prelude")
	RWInspect = build("rwlock_inspect", true, "rwlock_prelude")
)

//go:embed *.lua
var files embed.FS

// build makes the script name.lua, after the functions it calls of the
// prelude files own (a kind's own), then of prelude.lua when prelude is
// set. A function a script defines costs the server a closure at every
// run, called or not: a script gets only those it calls, and those that
// only its part after a "--#prelude" line calls go there, so that the
// common case, before it, returns without making them.
func build(name string, prelude bool, own ...string) *Script {
	head, tail, split := strings.Cut(read(name), "--#prelude\n")
	done := map[string]bool{}
	src := section(head, prelude, own, done, true)
	if split {
		src += section(tail, prelude, own, done, false)
	}
	s := &Script{Name: name, Src: src, Hash: hashes[name]}
	All = append(All, s)
	return s
}

// section returns src after the functions it calls of the files own, then
// of prelude.lua when prelude is set, but those of done, which it adds to
// done. With opening, each file's opening comment comes first even when
// none of its functions is needed.
func section(src string, prelude bool, own []string, done map[string]bool, opening bool) string {
	for i := len(own) - 1; i >= 0; i-- {
		if f := functionsFor(own[i], src, done, opening); f != "" {
			src = f + "\n" + src
		}
	}
	if prelude {
		if f := functionsFor("prelude", src, done, opening); f != "" {
			src = f + "\n" + src
		}
	}
	return src
}

// preludeFunc finds the name of a function of a prelude file.
var preludeFunc = regexp.MustCompile(`(?m)^local function (\w+)\(`)

// functionsFor returns the opening comment of the prelude file file.lua
// and those of its functions that src calls, directly or through one
// another, in their order, but those of done, which it adds to done. A
// function is its "local function" line, the comment lines right above it
// and the lines below it up to the next function's comment. Without
// opening, it returns "" when no function is needed.
func functionsFor(file, src string, done map[string]bool, opening bool) string {
	lines := strings.SplitAfter(read(file), "\n")
	var names []string
	var starts []int // each function's first comment line
	for i, line := range lines {
		if m := preludeFunc.FindStringSubmatch(line); m != nil {
			start := i
			for start > 0 && strings.HasPrefix(lines[start-1], "--") {
				start--
			}
			names, starts = append(names, m[1]), append(starts, start)
		}
	}
	if len(names) == 0 {
		panic("script: no function in " + file + ".lua")
	}
	body := func(i int) string {
		end := len(lines)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		return strings.Join(lines[starts[i]:end], "")
	}
	need := make([]bool, len(names))
	calls := src
	for changed := true; changed; {
		changed = false
		for i, name := range names {
			if !need[i] && regexp.MustCompile(`\b`+name+`\(`).MatchString(calls) {
				need[i], changed = true, true
				calls += body(i)
			}
		}
	}
	out := ""
	for i, name := range names {
		if need[i] && !done[file+"."+name] {
			done[file+"."+name] = true
			out += body(i)
		}
	}
	if out == "" && !opening {
		return ""
	}
	return strings.Join(lines[:starts[0]], "") + out
}

func read(name string) string {
	src, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic("script: " + err.Error())
	}
	return string(src)
}

// Args returns the arguments of EVALSHA running s, or EVAL when eval is
// set, without boxing the keys and the hash again.
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

// A Caller sends one command to Redis and returns its reply: a Redis error
// reply as an error with a RedisError method, as go-redis returns them.
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

// IsNoScript reports whether err is a server's NOSCRIPT reply: EVALSHA of
// a script it does not have.
func IsNoScript(err error) bool {
	var rerr interface {
		error
		RedisError()
	}
	if !errors.As(err, &rerr) {
		return false
	}
	return strings.HasPrefix(strings.TrimPrefix(rerr.Error(), "ERR "), "NOSCRIPT")
}
