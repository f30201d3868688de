package fencelock

import (
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
)
