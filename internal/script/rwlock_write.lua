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
