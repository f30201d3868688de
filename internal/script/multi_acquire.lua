-- multi_acquire: take several locks at once, all or none (AcquireAll on
-- one deployment, or on one Cluster slot). Each lock is taken as
-- acquire.lua takes it, at the same keys and with the same value, and gets
-- a fence from its own counter: a plain Acquire of one of the names, by
-- this version or an older one, finds it held.
--
-- KEYS[5i-4..5i]  the i-th lock's keys, as acquire.lua's KEYS[1..5]: the
--                 lock, its token marker, fence counter, queue and queue
--                 entries (see acquire.lua)
-- ARGV[1]         ttl, milliseconds
-- ARGV[2]         fence retention, milliseconds
-- ARGV[3]         owner
-- ARGV[3+i]       the i-th lock's token
--
-- Returns
--   {1, fence1, ..., fenceN}  every lock is ours: newly taken, or already
--                         held with its token (a retry after a lost reply);
--                         fences as decimal strings
--   {0, i, pttl, owner}   the i-th lock is held by another token (pttl as
--                         PTTL reports it), or, with pttl -3, free but with
--                         fair waiters in line: nothing was taken
--   {2}                   a token is retired (its AcquireAll gave up):
--                         nothing was taken
--
-- All checks come before the first write, so that an error (a key of
-- another type, a counter at its maximum) leaves every lock as it was.

local n = #KEYS / 5
for i = 1, n do
	if retired(KEYS[5 * i - 3]) then
		return {2}
	end
end

local now = clock()
local nowMs = millis(now)
local maxFence = '9223372036854775807'
local ours = {}
for i = 1, n do
	local k, token = 5 * i - 5, ARGV[3 + i]
	local held = redis.call('GET', KEYS[k + 1])
	if holds(held, token) then
		ours[i] = string.match(held, '^(%d+)', #token + 2)
	elseif held then
		return {0, i, redis.call('PTTL', KEYS[k + 1]), ownerOf(held)}
	else
		if firstLive(KEYS[k + 4], KEYS[k + 5], nowMs) then
			return {0, i, -3, 'the fair queue'}
		end
		-- issueFence counts on from a counter ahead of the clock with INCR,
		-- which fails at the maximum or on a value that is not a number:
		-- fail here, before any write, with INCR's own error.
		local counter = redis.call('GET', KEYS[k + 3])
		if counter and not below(counter, now)
			and (not string.match(counter, '^%d+$') or not below(counter, maxFence)) then
			redis.call('INCR', KEYS[k + 3])
		end
	end
end

local reply = {1}
for i = 1, n do
	local k = 5 * i - 5
	if ours[i] then
		keepFor(KEYS[k + 1], ARGV[1])
		reply[i + 1] = ours[i]
	else
		local fence = issueFence(KEYS[k + 3], now, ARGV[2])
		redis.call('SET', KEYS[k + 1], ARGV[3 + i] .. ' ' .. fence .. ' ' .. ARGV[3], 'PX', ARGV[1])
		reply[i + 1] = fence
	end
end
return reply
