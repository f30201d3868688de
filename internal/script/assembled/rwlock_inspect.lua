-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- clock returns this node's TIME in microseconds, as a decimal string.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- millis returns a time of clock's in milliseconds, as an exact number.
local function millis(micros)
	return math.floor(tonumber(micros) / 1000)
end


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
