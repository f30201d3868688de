-- semaphore_prelude: the functions a semaphore's scripts share (see
-- assemble_test.go). A semaphore's holders are a sorted set of their tokens by
-- the server time (ms) at which each one's permit expires; its info is a
-- hash of each holder's token to "<fence> <owner>", with the field 'n' (the
-- permits its holders use) and 'w' (the server time in ms until which a
-- plain waiter may wait for a release: the latest any asked for). The info
-- lives as long as the holders; with none, only 'w', for its window.

-- prune drops the holders whose permits expired before nowMs, and their
-- info, and returns how many holders are left; with none left, the info
-- goes too (a new number of permits is accepted then), once a holder was
-- dropped here or, with left set, by the caller (the info lives as long as
-- the holders otherwise).
local function prune(holders, info, nowMs, left)
	local gone = redis.call('ZRANGE', holders, '-inf', '(' .. nowMs, 'BYSCORE')
	for _, token in ipairs(gone) do
		redis.call('ZREM', holders, token)
		redis.call('HDEL', info, token)
	end
	local n = redis.call('ZCARD', holders)
	if n == 0 and (left or #gone > 0) then
		redis.call('DEL', info)
	end
	return n
end

-- soonest returns how long the permit that expires first has left (ms), and
-- its holder's owner.
local function soonest(holders, info, nowMs)
	local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
	local value = redis.call('HGET', info, first[1]) or ''
	return tonumber(first[2]) - nowMs, string.match(value, '^%d+ (.*)$') or ''
end

-- admit gives token a permit for ttl ms, stored with owner and the number
-- of permits, and returns its fence, issued by issueFence (prelude.lua) as
-- a lock's is; first says nobody held one (the keys are new).
local function admit(holders, info, counter, token, ttl, owner, permits, now, nowMs, retention, first)
	local fence = issueFence(counter, now, retention)
	redis.call('ZADD', holders, nowMs + tonumber(ttl), token)
	redis.call('HSET', info, token, fence .. ' ' .. owner, 'n', permits)
	if first then
		redis.call('PEXPIRE', holders, ttl)
		redis.call('PEXPIRE', info, ttl)
	else
		keepFor(holders, ttl)
		keepFor(info, ttl)
	end
	return fence
end
