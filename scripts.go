package fencelock

import (
	"context"
	"embed"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A script is one of the library's Lua scripts, one file each. They are sent
// as EVALSHA, and as EVAL when the server does not have the script cached
// (evalScript, deployment.run); the watchdog's renewals send EVAL directly
// (see Lease.extend). Every key a script touches is passed in KEYS.
type script struct {
	name      string // the file's, without ".lua"
	src, hash any    // the source and its SHA-1, boxed once for the commands' arguments
}

// The scripts' SHA-1s are constants (scriptHashes, in scripts_hashes.go),
// never computed: in FIPS 140-only mode (GODEBUG=fips140=only) crypto/sha1
// panics. TestScriptHashes checks them against the sources, and writes
// them anew for go generate.
//
//go:generate go test -run TestScriptHashes . -update-script-hashes

// scripts are the library's scripts, as newScript made them: the ones
// whose hashes scripts_hashes.go holds.
var scripts []*script

//go:embed *.lua
var luaFiles embed.FS

// newScript reads the script name.lua, after those of the functions of the
// files own (a kind's own, semaphore_prelude.lua, ...) that it calls, and
// after those of the functions the scripts share (prelude.lua) that they
// call, when prelude is set; all are local to each script. A function the
// script defines costs the server a closure at every run, called or not.
// Its hash is scriptHashes[name].
func newScript(name string, prelude bool, own ...string) *script {
	src := readLua(name)
	for i := len(own) - 1; i >= 0; i-- {
		src = functionsFor(own[i], src) + "\n" + src
	}
	if prelude {
		src = functionsFor("prelude", src) + "\n" + src
	}
	s := &script{name: name, src: src, hash: scriptHashes[name]}
	scripts = append(scripts, s)
	return s
}

// preludeFunc finds the name of a function of a prelude file.
var preludeFunc = regexp.MustCompile(`(?m)^local function (\w+)\(`)

// functionsFor returns the opening comment of the prelude file file.lua
// (prelude.lua, or a kind's own) and those of its functions that src calls,
// directly or through one another, in their order. A function is its "local
// function" line, the comment lines right above it and the lines below it
// up to the next function's comment.
func functionsFor(file, src string) string {
	lines := strings.SplitAfter(readLua(file), "\n")
	type fn struct {
		name  string
		start int // its first comment line
	}
	var fns []fn
	for i, line := range lines {
		if m := preludeFunc.FindStringSubmatch(line); m != nil {
			start := i
			for start > 0 && strings.HasPrefix(lines[start-1], "--") {
				start--
			}
			fns = append(fns, fn{m[1], start})
		}
	}
	if len(fns) == 0 {
		panic("fencelock: no function in " + file + ".lua")
	}
	body := func(i int) string {
		end := len(lines)
		if i+1 < len(fns) {
			end = fns[i+1].start
		}
		return strings.Join(lines[fns[i].start:end], "")
	}
	need := make([]bool, len(fns))
	calls := src
	for changed := true; changed; {
		changed = false
		for i, f := range fns {
			if !need[i] && regexp.MustCompile(`\b`+f.name+`\(`).MatchString(calls) {
				need[i], changed = true, true
				calls += body(i)
			}
		}
	}
	out := strings.Join(lines[:fns[0].start], "")
	for i := range fns {
		if need[i] {
			out += body(i)
		}
	}
	return out
}

func readLua(name string) string {
	src, err := luaFiles.ReadFile(name + ".lua")
	if err != nil {
		panic("fencelock: " + err.Error())
	}
	return string(src)
}

var (
	acquireScript        = newScript("acquire", true)
	releaseScript        = newScript("release", true)
	extendScript         = newScript("extend", true)
	queueScript          = newScript("queue", true)
	inspectScript        = newScript("inspect", false)
	grantScript          = newScript("redlock_grant", true)
	redlockReleaseScript = newScript("redlock_release", true)
	setFenceScript       = newScript("redlock_fence", true)
)

// scriptArgs returns the arguments of EVALSHA (or EVAL) running s, without
// boxing the keys and the hash again.
func scriptArgs(s *script, eval bool, keys, argv []any) []any {
	args := make([]any, 0, 3+len(keys)+len(argv))
	if eval {
		args = append(args, "eval", s.src)
	} else {
		args = append(args, "evalsha", s.hash)
	}
	args = append(args, len(keys))
	args = append(args, keys...)
	return append(args, argv...)
}

// evalScript runs s on c: EVALSHA, then EVAL when the server does not have
// it cached (NOSCRIPT), or EVAL alone when eval is set. It sends them with
// Process, which an AutoPipeliner batches (its Do runs each command on a
// connection of its own); on a client, Do is the same.
func evalScript(ctx context.Context, c redis.UniversalClient, s *script, eval bool, keys, argv []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, scriptArgs(s, eval, keys, argv)...)
	_ = c.Process(ctx, cmd)
	if err := cmd.Err(); !eval && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") { // no allocation on success
		cmd = redis.NewCmd(ctx, scriptArgs(s, true, keys, argv)...)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}
