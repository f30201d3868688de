package fencelock

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// A script is one of the library's Lua scripts, one file each. They are sent
// as EVALSHA, and as EVAL when the server does not have the script cached
// (evalScript, deployment.run); the watchdog's renewals send EVAL directly
// (see Lease.extend). Every key a script touches is passed in KEYS.
type script struct {
	name      string // the file's, without ".lua"
	src, hash any    // the source and its SHA1, boxed once for the commands' arguments
}

//go:embed *.lua
var luaFiles embed.FS

// newScript reads the script name.lua, after the functions the scripts
// share (prelude.lua, local to each script) when prelude is set.
func newScript(name string, prelude bool) *script {
	src := readLua(name)
	if prelude {
		src = readLua("prelude") + "\n" + src
	}
	sum := sha1.Sum([]byte(src))
	return &script{name: name, src: src, hash: hex.EncodeToString(sum[:])}
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
// it cached (NOSCRIPT), or EVAL alone when eval is set.
func evalScript(ctx context.Context, c redis.UniversalClient, s *script, eval bool, keys, argv []any) *redis.Cmd {
	cmd := c.Do(ctx, scriptArgs(s, eval, keys, argv)...)
	if err := cmd.Err(); !eval && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") { // no allocation on success
		cmd = c.Do(ctx, scriptArgs(s, true, keys, argv)...)
	}
	return cmd
}
