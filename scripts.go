package fencelock

import (
	_ "embed"
	"errors"
	"fmt"

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

	//go:embed inspect.lua
	inspectLua    string
	inspectScript = redis.NewScript(inspectLua)

	//go:embed redlock_grant.lua
	grantLua    string
	grantScript = redis.NewScript(grantLua)

	//go:embed redlock_fence.lua
	setFenceLua    string
	setFenceScript = redis.NewScript(setFenceLua)
)

// errRetired is the acquire script's refusal of a token whose Acquire gave
// up or whose lease was released: only a late copy of an attempt meets it.
var errRetired = errors.New("the acquisition was given up")

// decodeRelease decodes the release script's reply: 1, 0 or -1, or {1, error}
// when the lock was deleted but the wake-up could not be published.
func decodeRelease(reply any) (code int64, perr, err error) {
	switch r := reply.(type) {
	case int64:
		if r >= -1 && r <= 1 {
			return r, nil, nil
		}
	case []any:
		if len(r) == 2 {
			msg, _ := r[1].(string)
			if c, _ := r[0].(int64); c == 1 {
				return 1, errors.New(oneLine(msg)), nil
			}
		}
	}
	return 0, nil, fmt.Errorf("%w from the release script: %v", errReply, reply)
}
