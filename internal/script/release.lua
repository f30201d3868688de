-- release: delete the lock only if this token holds it and retire the
-- token; hand the lock to the first fair waiter in line, or wake the
-- waiters. A Redlock node has its own (redlock_release.lua).
--
-- KEYS[1..5]  the lock, the token's marker, the fence counter, the line and
--             its entries (see acquire.lua)
-- ARGV        token; how long the marker is kept (ms); fence retention (ms);
--             then, both optional: 'a' to abandon an Acquire that gave up
--             ('r', the default, releases a lease), and the wake-up channel
--             (KEYS[1], the default, on database 0; "@<db>" after it on
--             others)
--
-- Returns 1 when the lock was this token's and is now deleted (by this call
-- or an earlier one, per the marker), 0 when it does not exist, -1 when
-- another token holds it; {1, error} when deleted but the wake-up could not
-- be published (see publish).
--
-- The marker retires the token (see retire). With a fair waiter in line,
-- the lock is granted to the first in the same step, and "granted <token>
-- <fence>" is published; otherwise "released". The common case, a release
-- with nobody in line, runs first.

local token, channel = ARGV[1], ARGV[5] or KEYS[1]
local held = redis.call('GET', KEYS[1])
if ARGV[4] ~= 'a' and held and string.sub(held, 1, #token + 1) == token .. ' ' and redis.call('EXISTS', KEYS[4]) == 0 then
	redis.call('DEL', KEYS[1])
	redis.call('SET', KEYS[2], 'r', 'PX', ARGV[2])
	return publish(channel, 'released')
end
--#prelude

local code, deleted = unlock(KEYS[1], KEYS[2], token)
retire(KEYS[2], code, deleted, ARGV[4] == 'a', ARGV[2])
if not deleted then
	return code
end

local message = 'released'
if redis.call('EXISTS', KEYS[4]) == 1 then
	local now = clock()
	local nowMs = millis(now)
	while true do
		-- The first live waiter leaves the line and gets the lock, with
		-- its TTL and owner (an entry in another shape is dropped).
		local head, entry = firstLive(KEYS[4], KEYS[5], nowMs)
		if not head then
			break
		end
		drop(KEYS[4], KEYS[5], head)
		local ttl, owner = string.match(entry, '^%d+ (%d+) (.*)$')
		if ttl then
			local fence = issueFence(KEYS[3], now, ARGV[3])
			redis.call('SET', KEYS[1], head .. ' ' .. fence .. ' ' .. owner, 'PX', ttl)
			message = 'granted ' .. head .. ' ' .. fence
			break
		end
	end
end
return publish(channel, message)
