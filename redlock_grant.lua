-- redlock_grant: take the lock on one node of a Redlock quorum, and report
-- what the fence must exceed (phase 1 of NewRedlock's acquisition). Also
-- puts the lock back on a node that lost it while the lease holds a quorum
-- (a repair, with the lease's fence).
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token> (see release.lua)
-- KEYS[3]  fence counter, lock:{name}:fence
-- ARGV[1]  token            random, unique per attempt
-- ARGV[2]  ttl              milliseconds
-- ARGV[3]  fence            stored with the lock: "0" until phase 2
--                           (redlock_fence.lua) has issued it
-- ARGV[4]  owner            who takes the lock, stored with it
--
-- Returns
--   {1, counter, time}  the lock is ours (taken now, or already: a resent
--                       request), with this node's fence counter ("0"
--                       when it has none) and its TIME in microseconds,
--                       both decimal strings
--   {0, pttl, owner}    another token holds it (owner as it stored it)
--   {2}                 this token is retired (released, or its attempt
--                       given up): a late request must not take the lock

if redis.call('EXISTS', KEYS[2]) == 1 then
	return {2}
end
local held = redis.call('GET', KEYS[1])
if held then
	if string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then
		return {0, redis.call('PTTL', KEYS[1]), string.match(held, '^%S+ %S+ (.*)$') or ''}
	end
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
	redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4], 'PX', ARGV[2])
end
local t = redis.call('TIME')
return {1, redis.call('GET', KEYS[3]) or '0', t[1] .. string.rep('0', 6 - #t[2]) .. t[2]}
