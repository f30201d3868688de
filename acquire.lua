-- acquire: take the lock if it is free and issue a fencing token with it.
--
-- KEYS[1]  lock key,        e.g. lock:{name}
-- KEYS[2]  fence counter,   e.g. lock:{name}:fence (same hash tag)
-- ARGV[1]  token            random, unique per Acquire call
-- ARGV[2]  ttl              milliseconds
--
-- Returns {1, fence} when the lock is ours (newly taken, or already held with
-- this token because a retry follows a lost reply), {0, pttl} when another
-- token holds it (pttl as PTTL reports it: -1 when the key has no expiry).
--
-- The fence is INCR of the counter, floored by the server's TIME in
-- microseconds, so it keeps increasing when the counter key is lost.

local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	local issued = redis.call('GET', KEYS[2])
	if issued then
		return {1, tonumber(issued)}
	end
	-- The counter was lost while we held the lock: issue a new, larger fence.
elseif cur then
	return {0, redis.call('PTTL', KEYS[1])}
else
	redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end

local t = redis.call('TIME')
local floor = t[1] .. string.rep('0', 6 - string.len(t[2])) .. t[2]
local fence = redis.call('INCR', KEYS[2])
if fence < tonumber(floor) then
	redis.call('SET', KEYS[2], floor)
	fence = tonumber(floor)
end
return {1, fence}
