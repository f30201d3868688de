-- rwlock_inspect: read a read-write lock without changing anything (keys:
-- see rwlock_prelude.lua).
--
-- KEYS[1]  the writer
-- KEYS[2]  the readers' index
-- KEYS[3]  the waiting writers' intents
-- KEYS[4]  fence counter
--
-- Returns {writer, pttl, readers, waiting, counter}: the writer's value
-- ("" when none) and PTTL; the live readers' values and milliseconds
-- left, alternating, by expiry; how many writers' intents live; and the
-- counter ("" when there is none), read in one atomic step.

local nowMs = millis(clock())
local readers = {}
local index = redis.call('ZRANGEBYSCORE', KEYS[2], nowMs, '+inf', 'WITHSCORES')
for i = 1, #index, 2 do
	readers[#readers + 1] = index[i]
	readers[#readers + 1] = tonumber(index[i + 1]) - nowMs
end
return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]), readers,
	redis.call('ZCOUNT', KEYS[3], nowMs, '+inf'), redis.call('GET', KEYS[4]) or ''}
