-- rwlock_read: take a share of a read-write lock, if no writer holds it
-- and no writer waits for it, and issue a fence (keys: see
-- rwlock_prelude.lua).
--
-- KEYS[1]  this reader                    lock:{name}:rw:r:<token>
-- KEYS[2]  token marker                   lock:{name}:rw:t:<token>
-- KEYS[3]  fence counter                  lock:{name}:rw:fence
-- KEYS[4]  the readers' index             lock:{name}:rw:r
-- KEYS[5]  the waiting writers' intents   lock:{name}:rw:i
-- KEYS[6]  the writer                     lock:{name}:rw:w
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
-- ARGV[3]  fence retention, milliseconds
-- ARGV[4]  owner
--
-- Returns acquire.lua's replies: {1, fence}; {0, pttl, owner}, the
-- writer's PTTL and owner, or, with pttl -3, the lock is free of writers
-- but one waits; or {2} for a retired token.
--
-- A reader's entry in the index expires no earlier than its key, so that a
-- writer never enters while a share lives: on Redis 7 TIME, read after the
-- script started, is no earlier than the time its key's expiry counts
-- from; Redis 6.2 counts a SET's PX from the SET itself, which may fall in
-- the millisecond after TIME's, so the entry's expiry has 1 ms more.

if retired(KEYS[2]) then
	return {2}
end
local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
local now = clock()
local nowMs = millis(now)
if holds(held, token) then
	if keepFor(KEYS[1], ARGV[2]) then
		keep(KEYS[4], held, nowMs + tonumber(ARGV[2]) + 1, nowMs)
	end
	return {1, string.match(held, '^(%d+)', #token + 2)}
end

local writer = redis.call('GET', KEYS[6])
if writer then
	return {0, redis.call('PTTL', KEYS[6]), ownerOf(writer)}
end
if live(KEYS[5], nowMs) > 0 then
	return {0, -3, 'writers waiting'}
end

local fence = issueFence(KEYS[3], now, ARGV[3])
local value = token .. ' ' .. fence .. ' ' .. ARGV[4]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
keep(KEYS[4], value, nowMs + tonumber(ARGV[2]) + 1, nowMs)
return {1, fence}
