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

-- keepFor makes key live at least ms more, never less, and reports whether
-- it had less: a retry must not undo a longer Extend.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
end


-- semaphore_extend: reset a permit's expiry only if this token holds it. It
-- never gives back a permit that has expired.
--
-- KEYS[1]  holders, lock:{name}:sem (see semaphore_acquire.lua)
-- KEYS[2]  info, lock:{name}:sem:h
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
--
-- Returns 1 when the expiry was set, 0 when the token holds no permit
-- (expired, given back or taken away).

local nowMs = millis(clock())
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) < nowMs then
	return 0
end
redis.call('ZADD', KEYS[1], nowMs + tonumber(ARGV[2]), ARGV[1])
keepFor(KEYS[1], ARGV[2])
keepFor(KEYS[2], ARGV[2])
return 1
