-- semaphore_release: give a permit back only if this token holds it, and
-- retire the token; hand the freed permits to the first fair waiters in
-- line, and wake the plain waiters when one may wait.
--
-- KEYS[1..6]  as semaphore_acquire.lua's: holders, token marker, fence
--             counter, queue, queue entries, info
-- ARGV[1]     token
-- ARGV[2]     wake-up channel: the holders key, plus the database number on
--             a database other than 0
-- ARGV[3]     'r' to release a lease, 'a' to abandon an Acquire that gave up
-- ARGV[4]     how long the marker is kept, milliseconds
-- ARGV[5]     fence retention, milliseconds
--
-- The marker retires the token, as release.lua's does (see retire in
-- prelude.lua): 'r' whenever the permit is given back; 'a' where it was not
-- this token's, for 'a', so that a late copy of an acquire request does not
-- take a permit.
--
-- Once the permit is given back, the first live waiters in line are
-- granted the free permits in the same step, each with its TTL, owner and
-- a fence issued as semaphore_acquire.lua issues them, and "granted <token>
-- <fence>" is published for each: the waiter holds its permit when the
-- message arrives. A waiter in line for another number of permits than the
-- holders use leaves the line (its next keep-alive finds its entry gone and
-- its next attempt the mismatch). When a permit is still free and a plain
-- waiter may still wait ('w', until a wake window after it last found all
-- permits taken), "released" is published; a Locker wakes one of its
-- waiters on each, the others trying again within the window by themselves.
-- Otherwise nobody waits, and nothing is published.
--
-- Returns 1 when the permit was ours and is given back (by this call or,
-- per the marker, an earlier one), 0 when it is not held (expired, or
-- given back): a permit has no other holder; or {1, error} when a message
-- could not be published (the permit is given back all the same).

local token = ARGV[1]
local now = clock()
local nowMs = millis(now)
local code, deleted = 0, false
local expiry = redis.call('ZSCORE', KEYS[1], token)
if expiry and tonumber(expiry) >= nowMs then
	redis.call('ZREM', KEYS[1], token)
	redis.call('HDEL', KEYS[6], token)
	code, deleted = 1, true
elseif redis.call('GET', KEYS[2]) == 'r' then
	code = 1
end
retire(KEYS[2], code, deleted, ARGV[3] ~= 'r', ARGV[4])
if not deleted then
	return code
end

local waiting = tonumber(redis.call('HGET', KEYS[6], 'w'))
local permits = tonumber(redis.call('HGET', KEYS[6], 'n'))
local n = prune(KEYS[1], KEYS[6], nowMs, true)
local emptied = n == 0 -- the info went with the last holder, 'w' with it
local reply = 1
local function tell(message)
	local r = publish(ARGV[2], message)
	if reply == 1 then
		reply = r
	end
end

if redis.call('EXISTS', KEYS[4]) == 1 then
	while true do
		local head, entry = firstLive(KEYS[4], KEYS[5], nowMs)
		if not head then
			break
		end
		local ttl, want, owner = string.match(entry, '^%d+ (%d+) (%d+) (.*)$')
		if n == 0 and want then
			permits = tonumber(want) -- nobody holds one: the line's first sets the number
		end
		if permits and n >= permits then
			break
		end
		drop(KEYS[4], KEYS[5], head)
		if want and tonumber(want) == permits then
			local fence = admit(KEYS[1], KEYS[6], KEYS[3], head, ttl, owner, want, now, nowMs, ARGV[5], n == 0)
			n = n + 1
			tell('granted ' .. head .. ' ' .. fence)
		end
	end
end
if waiting and waiting >= nowMs then
	if emptied and n > 0 then
		redis.call('HSET', KEYS[6], 'w', waiting) -- for the grants' releases
	end
	if not permits or n < permits then
		tell('released')
	end
end
return reply
