package fencelock

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one per file. Each is compiled once and run with
// Script.Run, which sends EVALSHA and falls back to EVAL when the server does
// not have the script cached; only the watchdog's renewals send EVAL directly
// (see Lease.extend). Every key a script touches is passed in KEYS.
var (
	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(acquireLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)

	//go:embed extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)

	//go:embed queue.lua
	queueLua    string
	queueScript = redis.NewScript(queueLua)

	//go:embed inspect.lua
	inspectLua    string
	inspectScript = redis.NewScript(inspectLua)

	//go:embed redlock_grant.lua
	grantLua    string
	grantScript = redis.NewScript(grantLua)

	//go:embed redlock_release.lua
	redlockReleaseLua    string
	redlockReleaseScript = redis.NewScript(redlockReleaseLua)

	//go:embed redlock_fence.lua
	setFenceLua    string
	setFenceScript = redis.NewScript(setFenceLua)
)

// scriptHashes and scriptSources are each script's SHA1 and source, boxed
// once for the commands' arguments.
var scriptHashes, scriptSources = func() (h, src map[*redis.Script]any) {
	h, src = make(map[*redis.Script]any), make(map[*redis.Script]any)
	for s, lua := range map[*redis.Script]string{
		acquireScript: acquireLua, releaseScript: releaseLua, extendScript: extendLua,
		inspectScript: inspectLua, grantScript: grantLua, redlockReleaseScript: redlockReleaseLua, setFenceScript: setFenceLua, queueScript: queueLua,
	} {
		h[s], src[s] = s.Hash(), lua
	}
	return h, src
}()

// scriptArgs returns the arguments of EVALSHA (or EVAL) running script:
// what Script.Run sends, without boxing the keys and the hash again.
func scriptArgs(script *redis.Script, eval bool, keys, argv []any) []any {
	args := make([]any, 0, 3+len(keys)+len(argv))
	if eval {
		args = append(args, "eval", scriptSources[script])
	} else {
		args = append(args, "evalsha", scriptHashes[script])
	}
	args = append(args, len(keys))
	args = append(args, keys...)
	return append(args, argv...)
}

// evalScript runs script on c: EVALSHA, then EVAL when the server does not
// have it cached (NOSCRIPT), or EVAL alone when eval is set.
func evalScript(ctx context.Context, c redis.UniversalClient, script *redis.Script, eval bool, keys, argv []any) *redis.Cmd {
	cmd := c.Do(ctx, scriptArgs(script, eval, keys, argv)...)
	if err := cmd.Err(); !eval && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") { // no allocation on success
		cmd = c.Do(ctx, scriptArgs(script, true, keys, argv)...)
	}
	return cmd
}
