-- semaphore_queue: a fair waiter's keep-alive, or its departure, in a
-- semaphore's line. It answers as queue.lua does, which fair.go reads.
--
-- KEYS[1]  holders, lock:{name}:sem (see semaphore_acquire.lua)
-- KEYS[2]  queue, lock:{name}:sem:q
-- KEYS[3]  queue entries, lock:{name}:sem:qi
-- KEYS[4]  info, lock:{name}:sem:h
-- ARGV[1]  token
-- ARGV[2]  'k' to keep the waiter's entry alive, 'd' to leave the queue
-- ARGV[3]  entry ttl, milliseconds
-- ARGV[4]  ttl of the permit, milliseconds, for a grant
-- ARGV[5]  owner, for a grant
-- ARGV[6]  the Semaphore's number of permits
--
-- Returns
--   {1, fence, pttl}  a release granted this token a permit: the waiter
--               holds it, for pttl more milliseconds; for 'd', the caller
--               must release it, which hands it on
--   {0, pttl}   'k': still waiting, the entry kept alive, and when the
--               first permit expires (-2: one is free, a waiter ahead of
--               this one takes it)
--   {0}         'd': left
--   {3}         'k': the entry is gone (it expired, or a release dropped
--               it): join again
--   {4}         'k': a permit is free and this waiter is first in line:
--               take it (semaphore_acquire.lua)

local token = ARGV[1]
local nowMs = millis(clock())
local expiry = redis.call('ZSCORE', KEYS[1], token)
local held = expiry and tonumber(expiry) >= nowMs and redis.call('HGET', KEYS[4], token)
if held then
	drop(KEYS[2], KEYS[3], token)
	return {1, string.match(held, '^(%d+)'), tonumber(expiry) - nowMs}
end
local reply = outOfLine(KEYS[2], KEYS[3], token, ARGV[2])
if reply then
	return reply
end
keepEntry(KEYS[2], KEYS[3], token, nowMs, ARGV[3], ARGV[4] .. ' ' .. ARGV[6] .. ' ' .. ARGV[5])
local n = prune(KEYS[1], KEYS[4], nowMs, false)
local permits = tonumber(n > 0 and redis.call('HGET', KEYS[4], 'n') or ARGV[6])
if n < permits then
	return whenFree(KEYS[2], KEYS[3], token, nowMs)
end
return {0, (soonest(KEYS[1], KEYS[4], nowMs))}
