package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The prototypes measure what the plain lock's scripts would cost without
// one of the things they do, for README.md's "issue 36" section. They send
// the library's keys and arguments (5 KEYS; 4 ARGV to acquire, 3 to
// release) and keep its common cases' code but for what each one drops.
// None is a lock to use: each gives up an answer the library keeps.
var prototypes = map[string][2]string{
	// empty: two scripts that return at once, the floor of two EVALSHA
	// calls with the library's arguments.
	"empty": {`return {1, '1'}`, `return 1`},
	// nomarker: the release writes no marker of its token.
	"nomarker": {protoAcquire, protoRelease},
	// nocounter: no marker, and the fence is the server's time alone (no
	// counter key): fences no longer increase across a clock stepped back.
	"nocounter": {`
local token = ARGV[1]
if redis.call('EXISTS', KEYS[2], KEYS[4]) == 0 and not redis.call('GET', KEYS[1]) then
	local t = redis.call('TIME')
	local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
	redis.call('SET', KEYS[1], token .. ' ' .. now .. ' ' .. ARGV[4], 'PX', ARGV[2])
	return {1, now}
end
return {0, 0, ''}`, protoRelease},
}

// protoAcquire is acquire.lua's common case as it stands.
const protoAcquire = `
local token = ARGV[1]
if redis.call('EXISTS', KEYS[2], KEYS[4]) == 0 and not redis.call('GET', KEYS[1]) then
	local t = redis.call('TIME')
	local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
	local prev = redis.call('SET', KEYS[3], now, 'PX', ARGV[3], 'GET')
	if not prev or #prev < #now or (#prev == #now and prev < now) then
		redis.call('SET', KEYS[1], token .. ' ' .. now .. ' ' .. ARGV[4], 'PX', ARGV[2])
		return {1, now}
	end
end
return {0, 0, ''}`

// protoRelease is release.lua's common case without the marker's SET.
const protoRelease = `
local function publish(channel, message)
	local ok, err = pcall(redis.call, 'SPUBLISH', channel, message)
	if not ok then
		local ok2 = pcall(redis.call, 'PUBLISH', channel, message)
		if not ok2 then
			if type(err) == 'table' then err = err.err end
			return {1, tostring(err)}
		end
	end
	return 1
end
local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #token + 1) == token .. ' ' and redis.call('EXISTS', KEYS[4]) == 0 then
	redis.call('DEL', KEYS[1])
	return publish(KEYS[1], 'released')
end
return 0`

// prototype returns one acquire+release of the prototype called kind.
func prototype(client *redis.Client, kind string) func(context.Context) error {
	src := prototypes[kind]
	acquire, release := redis.NewScript(src[0]), redis.NewScript(src[1])
	return func(ctx context.Context) error {
		token := (rand.Text() + rand.Text())[:36] // a UUID's length, as the library's
		keys := []string{"lock:{ops}", "lock:{ops}:t:" + token, "lock:{ops}:fence", "lock:{ops}:q", "lock:{ops}:qi"}
		got, err := acquire.Run(ctx, client, keys, token, 30000, time.Hour.Milliseconds(), "vm (pid 1)").Slice()
		if err != nil || len(got) == 0 || got[0] != int64(1) {
			return fmt.Errorf("%s: acquire %v %v", kind, got, err)
		}
		return release.Run(ctx, client, keys, token, 5000, time.Hour.Milliseconds()).Err()
	}
}
