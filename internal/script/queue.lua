-- queue: a fair waiter's keep-alive, or its departure.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  queue, lock:{name}:q (see acquire.lua)
-- KEYS[3]  queue entries, lock:{name}:qi (see acquire.lua)
-- ARGV[1]  token
-- ARGV[2]  'k' to keep the waiter's entry alive, 'd' to leave the queue
-- ARGV[3]  entry ttl, milliseconds
-- ARGV[4]  ttl of the lock, milliseconds, for a grant
-- ARGV[5]  owner, for a grant
--
-- Returns
--   {1, fence, pttl}  the lock was granted to this token (a release handed
--               it over): the waiter holds it, for pttl more milliseconds;
--               for 'd', the caller must release it, which hands it on
--   {0, pttl}   'k': still waiting, the entry kept alive, and the lock's
--               PTTL (-2: free, a waiter ahead of this one takes it)
--   {0}         'd': left
--   {3}         'k': the entry is gone (it expired): join again
--   {4}         'k': the lock is free and this waiter is first in line:
--               take it (acquire.lua)

local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
if holds(held, token) then
	drop(KEYS[2], KEYS[3], token)
	return {1, string.match(held, '^(%d+)', #token + 2), redis.call('PTTL', KEYS[1])}
end
local reply = outOfLine(KEYS[2], KEYS[3], token, ARGV[2])
if reply then
	return reply
end
local nowMs = millis(clock())
keepEntry(KEYS[2], KEYS[3], token, nowMs, ARGV[3], ARGV[4] .. ' ' .. ARGV[5])
if not held then
	return whenFree(KEYS[2], KEYS[3], token, nowMs)
end
return {0, redis.call('PTTL', KEYS[1])}
