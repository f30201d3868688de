-- redlock_grant: take the lock on one node of a Redlock quorum and count
-- this node's fence counter on (phase 1 of NewRedlock's acquisition). Also
-- puts the lock back on a node that lost it while the lease holds a quorum
-- (a repair, with the lease's fence).
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token> (see release.lua)
-- KEYS[3]  fence counter, lock:{name}:fence
-- ARGV[1]  token            random, unique per attempt
-- ARGV[2]  ttl              milliseconds
-- ARGV[3]  fence            "0" for an attempt: the counter is counted on
--                           and its new value stored with the lock; for a
--                           repair, the lease's fence, stored with the lock
--                           and raised into the counter (max)
-- ARGV[4]  owner            who takes the lock, stored with it
-- ARGV[5]  fence retention  milliseconds the counter is kept
--
-- An attempt's counter is one more than it was, or, where it does not
-- exist (never written, expired after the retention, or lost in a restart
-- without persistence) or was not positive, this node's TIME in
-- microseconds. INCR is the script's first write: when it fails (the
-- counter at its maximum, or not a number), nothing is written and its
-- error is the script's.
--
-- Returns
--   {1, fence, time}  the lock is ours (taken now, or already: a resent
--                     request), with the fence stored with it here and
--                     this node's TIME in microseconds, both decimal
--                     strings (Lua numbers are doubles); the time dates the
--                     grant for diagnostics (the chaos suite's checker)
--   {0, pttl, owner}  another token holds it (owner as it stored it)
--   {2}               this token is retired (released, or its attempt
--                     given up): a late request must not take the lock

local function now()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

if redis.call('EXISTS', KEYS[2]) == 1 then
	return {2}
end
local held = redis.call('GET', KEYS[1])
if held then
	if string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then
		return {0, redis.call('PTTL', KEYS[1]), string.match(held, '^%S+ %S+ (.*)$') or ''}
	end
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return {1, string.match(held, '^%S+ (%S+)'), now()}
end

local fence = ARGV[3]
if fence == '0' then
	local n = redis.call('INCR', KEYS[3])
	if n <= 1 then
		-- No counter here: start it from the clock.
		fence = now()
		redis.call('SET', KEYS[3], fence, 'PX', ARGV[5])
	else
		if n < 9007199254740992 then
			fence = string.format('%.0f', n)
		else
			fence = redis.call('GET', KEYS[3]) -- exact beyond 2^53
		end
		redis.call('PEXPIRE', KEYS[3], ARGV[5])
	end
else
	local c = redis.call('GET', KEYS[3])
	if not c or #c < #fence or (#c == #fence and c < fence) then
		redis.call('SET', KEYS[3], fence, 'PX', ARGV[5])
	end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. fence .. ' ' .. ARGV[4], 'PX', ARGV[2])
return {1, fence, now()}
