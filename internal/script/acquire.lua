-- acquire: take the lock if it is free and issue a fencing token with it;
-- for a fair waiter, join the lock's line when it is not free.
--
-- KEYS[1..5]  the lock ("<token> <fence> <owner>"), the token's marker
--             (exists once its lease was released or its Acquire gave up),
--             the fence counter, the line (a sorted set of fair waiters'
--             tokens by the server time they joined) and its entries (a hash
--             of each waiter's token to "<expiry ms> <ttl> <owner>")
-- ARGV        token, ttl (ms), fence retention (ms), owner; a fair caller
--             adds '1' and its entry's ttl (ms)
--
-- Returns {1, fence}: ours, taken now or held by this token already (a retry
-- after a lost reply, or a grant in line; its expiry made at least ttl), the
-- fence as a decimal string; {0, pttl, owner}: held by another (pttl -3:
-- free, but fair waiters go first); {2}: the token is retired, and a late
-- copy of its attempt must not take the lock.
--
-- The common case, a free lock with no line, runs first (issueFence inline).

local token = ARGV[1]
local seen = redis.call('EXISTS', KEYS[2], KEYS[4])
local held = seen == 0 and redis.call('GET', KEYS[1])
if seen == 0 and not held then
	local t = redis.call('TIME')
	local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
	local prev = redis.call('SET', KEYS[3], now, 'PX', ARGV[3], 'GET')
	if not prev or #prev < #now or (#prev == #now and prev < now) then
		redis.call('SET', KEYS[1], token .. ' ' .. now .. ' ' .. ARGV[4], 'PX', ARGV[2])
		return {1, now}
	end
	redis.call('SET', KEYS[3], prev, 'PX', ARGV[3]) -- ahead of the clock: issueFence counts on from it
end
--#prelude

local queued = false
if seen > 0 then
	if seen == 2 or retired(KEYS[2]) then
		return {2}
	end
	queued = true
	held = redis.call('GET', KEYS[1])
end
if holds(held, token) then
	keepFor(KEYS[1], ARGV[2])
	if queued then
		drop(KEYS[4], KEYS[5], token)
	end
	return {1, string.match(held, '^(%d+)', #token + 2)}
end
local fair = ARGV[5] == '1'
if held and not fair then
	return {0, redis.call('PTTL', KEYS[1]), ownerOf(held)}
end

local now = clock()
if queued or held then
	local nowMs = millis(now)
	if held then -- and fair
		join(KEYS[4], KEYS[5], token, now, nowMs, ARGV[6], ARGV[2] .. ' ' .. ARGV[4])
		return {0, redis.call('PTTL', KEYS[1]), ownerOf(held)}
	end
	-- Free: the first live waiter in line goes first.
	local first = firstLive(KEYS[4], KEYS[5], nowMs)
	if first and first ~= token then
		if fair then
			join(KEYS[4], KEYS[5], token, now, nowMs, ARGV[6], ARGV[2] .. ' ' .. ARGV[4])
		end
		return {0, -3, 'the fair queue'}
	end
	if first then
		drop(KEYS[4], KEYS[5], token)
	end
end

local fence = issueFence(KEYS[3], now, ARGV[3])
redis.call('SET', KEYS[1], token .. ' ' .. fence .. ' ' .. ARGV[4], 'PX', ARGV[2])
return {1, fence}
