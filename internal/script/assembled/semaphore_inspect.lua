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


-- semaphore_inspect: read a semaphore without changing anything.
--
-- KEYS[1]  holders, lock:{name}:sem (see semaphore_acquire.lua)
-- KEYS[2]  info, lock:{name}:sem:h
-- KEYS[3]  fence counter, lock:{name}:sem:fence
--
-- Returns {permits, counter, holders}, read in one atomic step: the permits
-- the holders use ('' when none holds one), the counter ('' when there is
-- none), and for each holder whose permit has not expired its token, its
-- PTTL in milliseconds and its "<fence> <owner>", three items each.

local nowMs = millis(clock())
local live = redis.call('ZRANGE', KEYS[1], nowMs, '+inf', 'BYSCORE', 'WITHSCORES')
local holders = {}
for i = 1, #live, 2 do
	holders[#holders + 1] = live[i]
	holders[#holders + 1] = tonumber(live[i + 1]) - nowMs
	holders[#holders + 1] = redis.call('HGET', KEYS[2], live[i]) or ''
end
local permits = #live > 0 and redis.call('HGET', KEYS[2], 'n') or ''
return {permits, redis.call('GET', KEYS[3]) or '', holders}
