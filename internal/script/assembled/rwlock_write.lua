-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- ownerOf returns the owner in the lock's value held, or ''.
local function ownerOf(held)
	return string.match(held, '^%S+ %S+ (.*)$') or ''
end

-- below reports whether the decimal string a is a smaller number than b
-- (Lua numbers are doubles, which round beyond 2^53).
local function below(a, b)
	return #a < #b or (#a == #b and a < b)
end

-- clock returns this node's TIME in microseconds, as a decimal string.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- millis returns a time of clock's in milliseconds, as an exact number.
local function millis(micros)
	return math.floor(tonumber(micros) / 1000)
end

-- issueFence issues a fence from the counter, kept retention ms: now, or
-- the previous fence plus one when that is more (INCR's exact arithmetic
-- fails at the maximum before writing); it keeps increasing when the
-- counter is lost.
local function issueFence(counter, now, retention)
	local prev = redis.call('SET', counter, now, 'PX', retention, 'GET')
	if prev and not below(prev, now) then
		redis.call('SET', counter, prev, 'PX', retention)
		redis.call('INCR', counter)
		return redis.call('GET', counter)
	end
	return now
end

-- keepFor makes key live at least ms more, never less, and reports whether
-- it had less: a retry must not undo a longer Extend.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
end

-- retired reports whether a token's marker exists (see retire).
local function retired(marker)
	return redis.call('EXISTS', marker) == 1
end


-- rwlock_prelude: the functions the read-write lock's scripts share (see
-- assemble_test.go).
--
-- A read-write lock's keys share the name's hash tag: the writer
-- lock:{name}:rw:w and each reader lock:{name}:rw:r:<token>, both holding
-- "<token> <fence> <owner>" with the lease's TTL; the readers' index
-- lock:{name}:rw:r, a sorted set of the readers' values by their expiry
-- (server time in ms); the waiting writers' intents lock:{name}:rw:i, a
-- sorted set of their tokens by expiry; and the fence counter
-- lock:{name}:rw:fence.

-- live prunes the entries of a sorted set by expiry that have expired
-- before nowMs, and returns how many are left.
local function live(set, nowMs)
	redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. nowMs)
	return redis.call('ZCARD', set)
end

-- keep adds member to a sorted set by expiry, or moves it, to expire at
-- expiry, and makes the key live as long as its longest-lived entry.
local function keep(set, member, expiry, nowMs)
	redis.call('ZADD', set, expiry, member)
	local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
	redis.call('PEXPIRE', set, math.max(tonumber(last) - nowMs, 1))
end

-- rwlock_write: take a read-write lock exclusively, if no writer holds it
-- and no reader's share lives, and issue a fence; a writer that waits
-- leaves an intent that stops new readers while it lives (keys: see
-- rwlock_prelude.lua).
--
-- KEYS[1]  the writer                     lock:{name}:rw:w
-- KEYS[2]  token marker                   lock:{name}:rw:t:<token>; exists
--                                         once the token was released or its
--                                         Acquire gave up
-- KEYS[3]  fence counter                  lock:{name}:rw:fence
-- KEYS[4]  the readers' index             lock:{name}:rw:r
-- KEYS[5]  the waiting writers' intents   lock:{name}:rw:i
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
-- ARGV[3]  fence retention, milliseconds
-- ARGV[4]  owner
-- ARGV[5]  intent ttl, milliseconds: how long the intent of a writer that
--          waits lives after this attempt; 0 for a writer that tries once
--
-- Returns acquire.lua's replies: {1, fence}, {0, pttl, owner} (the
-- writer's PTTL, or, held by readers, the time until the last one's share
-- expires), or {2} for a retired token.

if retired(KEYS[2]) then
	return {2}
end
local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
if holds(held, token) then
	keepFor(KEYS[1], ARGV[2])
	redis.call('ZREM', KEYS[5], token)
	return {1, string.match(held, '^(%d+)', #token + 2)}
end

local now = clock()
local nowMs = millis(now)

-- intend keeps the intent of a writer that waits alive.
local function intend()
	local ttl = tonumber(ARGV[5])
	if ttl > 0 then
		keep(KEYS[5], token, nowMs + ttl, nowMs)
	end
end

if held then
	intend()
	return {0, redis.call('PTTL', KEYS[1]), ownerOf(held)}
end
local readers = live(KEYS[4], nowMs)
if readers > 0 then
	intend()
	local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
	local owner = ownerOf(last[1])
	if readers > 1 then
		owner = owner .. ' and ' .. (readers - 1) .. ' more readers'
	end
	return {0, tonumber(last[2]) - nowMs, owner}
end

redis.call('ZREM', KEYS[5], token)
local fence = issueFence(KEYS[3], now, ARGV[3])
redis.call('SET', KEYS[1], token .. ' ' .. fence .. ' ' .. ARGV[4], 'PX', ARGV[2])
return {1, fence}
