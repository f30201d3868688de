-- acquire: take the lock if it is free and issue a fencing token with it;
-- for a fair waiter, join the lock's queue when it is not free.
--
-- KEYS[1]  lock key         e.g. lock:{name}; its value is
--                           "<token> <fence> <owner>"
-- KEYS[2]  token marker     lock:{name}:t:<token> (same hash tag); exists
--                           once the token was released or its Acquire gave
--                           up (see release.lua)
-- KEYS[3]  fence counter    lock:{name}:fence
-- KEYS[4]  queue            lock:{name}:q, a sorted set of the fair waiters'
--                           tokens by the server time they joined
-- KEYS[5]  queue entries    lock:{name}:qi, a hash of each waiter's token to
--                           "<expiry> <ttl> <owner>" (expiry: server time in
--                           ms until which it is kept without a keep-alive)
-- ARGV[1]  token            random, unique per Acquire call
-- ARGV[2]  ttl              milliseconds
-- ARGV[3]  fence retention  milliseconds the counter is kept
-- ARGV[4]  owner            who takes the lock, stored with it
-- ARGV[5]  fair             '1': wait in the queue; '0' or absent: not
-- ARGV[6]  entry ttl        milliseconds a queue entry is kept without a
--                           keep-alive; only a fair caller passes it
--
-- Returns
--   {1, fence}        the lock is ours: newly taken, or already held with
--                     this token (a retry after a lost reply, or a grant at
--                     a release while this waiter was in the queue; its
--                     expiry made at least ttl from now, never earlier: an
--                     Extend may have come first), with the fence issued
--                     to this token; fences are decimal
--                     strings, as Lua numbers are doubles and would round
--                     them beyond 2^53
--   {0, pttl, owner}  another token holds it (pttl as PTTL reports it), or,
--                     with pttl -3, it is free but fair waiters are in line
--                     first (a fair caller has joined the queue then)
--   {2}               this token is retired: its Acquire gave up, or its
--                     lease was released; a late copy of the attempt must
--                     not take the lock
--
-- The fence is issued by issueFence (prelude.lua), as release.lua issues it
-- when it hands the lock to a waiter.
--
-- The common case, a free lock with no queue and a token not retired,
-- costs five calls: one EXISTS for both the marker and the queue, the GET,
-- the fence's TIME and SET, and the lock's SET; a busy answer to a caller
-- that does not queue costs EXISTS, GET and PTTL.

local token = ARGV[1]
local queued = false
local seen = redis.call('EXISTS', KEYS[2], KEYS[4])
if seen > 0 then
	if seen == 2 or retired(KEYS[2]) then
		return {2}
	end
	queued = true
end
local held = redis.call('GET', KEYS[1])
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
	-- Free: the first live waiter in the queue goes first.
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
