-- acquire: take the lock if it is free and issue a fencing token with it.
--
-- KEYS[1]  lock key         e.g. lock:{name}; its value is
--                           "<token> <fence> <owner>"
-- KEYS[2]  token marker     lock:{name}:t:<token> (same hash tag); exists
--                           once the token was released or its Acquire gave
--                           up (see release.lua)
-- KEYS[3]  fence counter    lock:{name}:fence
-- ARGV[1]  token            random, unique per Acquire call
-- ARGV[2]  ttl              milliseconds
-- ARGV[3]  fence retention  milliseconds the counter is kept
-- ARGV[4]  owner            who takes the lock, stored with it
--
-- Returns
--   {1, fence}  the lock is ours: newly taken, or already held with this
--               token (a retry after a lost reply), with the fence issued to
--               this token; fences are decimal strings, as Lua numbers are
--               doubles and would round them beyond 2^53
--   {0, pttl, owner}  another token holds it (pttl as PTTL reports it;
--               owner as the holder stored it, "" if it did not)
--   {2}         this token is retired: its Acquire gave up, or its lease
--               was released; a late copy of the attempt must not take the
--               lock
--
-- The fence is the previous fence plus one, floored by the server's TIME in
-- microseconds, so it keeps increasing when the counter key is lost or has
-- expired. Nothing is written when the counter cannot be incremented (at
-- its maximum: INCR fails before writing).

if redis.call('EXISTS', KEYS[2]) == 1 then
	return {2}
end
local held = redis.call('GET', KEYS[1])
if held then
	local n = #ARGV[1]
	if string.sub(held, 1, n + 1) == ARGV[1] .. ' ' then
		redis.call('PEXPIRE', KEYS[1], ARGV[2])
		local fence = string.match(held, '^(%d+)', n + 2)
		return {1, fence}
	end
	return {0, redis.call('PTTL', KEYS[1]), string.match(held, '^%S+ %S+ (.*)$') or ''}
end

local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local fence = now
local prev = redis.call('SET', KEYS[3], now, 'PX', ARGV[3], 'GET')
if prev and (#prev > #now or (#prev == #now and prev >= now)) then
	-- The counter is ahead of the clock (several fences within one
	-- microsecond, or a server clock that stepped back): put it back and
	-- count on from it, with INCR's exact 64-bit arithmetic, which fails
	-- at the maximum (or on a value that is not a number) before the lock
	-- is set.
	redis.call('SET', KEYS[3], prev, 'PX', ARGV[3])
	redis.call('INCR', KEYS[3])
	fence = redis.call('GET', KEYS[3])
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. fence .. ' ' .. ARGV[4], 'PX', ARGV[2])
return {1, fence}
