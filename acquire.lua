-- acquire: take the lock if it is free and issue a fencing token with it.
--
-- KEYS[1]  lock key,        e.g. lock:{name}
-- KEYS[2]  fence counter,   e.g. lock:{name}:fence (same hash tag)
-- ARGV[1]  token            random, unique per Acquire call
-- ARGV[2]  ttl              milliseconds
--
-- Returns {1, fence} (the fence as a decimal string: Lua numbers are doubles
-- and would round fences beyond 2^53) when the lock is ours (newly taken, or already held with
-- this token because a retry follows a lost reply), {0, pttl} when another
-- token holds it (pttl as PTTL reports it: -1 when the key has no expiry).
--
-- The fence is the previous fence plus one, floored by the server's TIME in
-- microseconds, so it keeps increasing when the counter key is lost.

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	if redis.call('GET', KEYS[1]) ~= ARGV[1] then
		return {0, redis.call('PTTL', KEYS[1])}
	end
	-- Ours already: this is a retry after a lost reply.
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	local issued = redis.call('GET', KEYS[2])
	if issued then
		return {1, issued}
	end
	-- The counter was lost while we held the lock: issue a new, larger fence.
end

local t = redis.call('TIME')
local floor = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local prev = redis.call('SET', KEYS[2], floor, 'GET')
if prev and tonumber(prev) >= tonumber(floor) then
	-- The counter is ahead of the clock (several fences within one
	-- microsecond, or a server clock that stepped back): count on from it,
	-- with INCR's exact 64-bit arithmetic (Lua numbers are doubles).
	redis.call('SET', KEYS[2], prev)
	redis.call('INCR', KEYS[2])
	return {1, redis.call('GET', KEYS[2])}
end
return {1, floor}
