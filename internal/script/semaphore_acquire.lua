-- semaphore_acquire: take one of a semaphore's permits if one is free, and
-- issue a fencing token with it; for a fair waiter, join the semaphore's
-- line when none is. See semaphore_prelude.lua for the holders and info.
--
-- KEYS[1]  holders         lock:{name}:sem, a sorted set of the holders'
--                          tokens by the server time (ms) their permits
--                          expire at
-- KEYS[2]  token marker    lock:{name}:sem:t:<token>; exists once the
--                          token was released or its Acquire gave up (see
--                          semaphore_release.lua)
-- KEYS[3]  fence counter   lock:{name}:sem:fence
-- KEYS[4]  queue           lock:{name}:sem:q, the fair waiters' tokens by
--                          the server time they joined (as acquire.lua's)
-- KEYS[5]  queue entries   lock:{name}:sem:qi, each waiter's token to
--                          "<expiry> <ttl> <permits> <owner>"
-- KEYS[6]  info            lock:{name}:sem:h, a hash of each holder's
--                          token to "<fence> <owner>", 'n' to the permits
--                          its holders use, 'w' to the server time (ms)
--                          until which a plain waiter may wait
-- ARGV[1]  token           random, unique per Acquire call
-- ARGV[2]  ttl             milliseconds
-- ARGV[3]  fence retention milliseconds the counter is kept
-- ARGV[4]  owner
-- ARGV[5]  fair            '1': wait in the queue; '0': not
-- ARGV[6]  entry ttl       milliseconds a queue entry is kept without a
--                          keep-alive
-- ARGV[7]  permits         the Semaphore's number of permits
-- ARGV[8]  wake window     milliseconds within which a plain waiter that
--                          found all permits taken tries again, unless a
--                          release wakes it first (its longest pause and
--                          attempt)
--
-- Returns
--   {1, fence}              a permit is ours: newly taken, or held by this
--                           token already (a retry after a lost reply, or
--                           a grant at a release while it was in line),
--                           its expiry made at least ttl from now (never
--                           earlier); the fence as a decimal string
--   {0, pttl, n, owner}     all n permits are held; the first to expire,
--                           owner's, in pttl ms. pttl -3: a permit is free,
--                           but fair waiters are in line first. A fair
--                           caller has joined the queue then; a plain one
--                           has set 'w', so that the releases of the next
--                           ARGV[8] ms wake the waiters
--   {2}                     this token is retired
--   {3, permits}            the holders use another number of permits

if retired(KEYS[2]) then
	return {2}
end
local token = ARGV[1]
local now = clock()
local nowMs = millis(now)
local expiry = redis.call('ZSCORE', KEYS[1], token)
local held = expiry and tonumber(expiry) >= nowMs and redis.call('HGET', KEYS[6], token)
if held then
	redis.call('ZADD', KEYS[1], 'GT', nowMs + tonumber(ARGV[2]), token) -- never earlier: see keepFor
	keepFor(KEYS[1], ARGV[2])
	keepFor(KEYS[6], ARGV[2])
	drop(KEYS[4], KEYS[5], token)
	return {1, string.match(held, '^(%d+)')}
end

local n = prune(KEYS[1], KEYS[6], nowMs)
if n > 0 then
	local used = redis.call('HGET', KEYS[6], 'n')
	if used and used ~= ARGV[7] then
		return {3, used}
	end
end

-- busy: join the line, or ask the releases of the wake window to wake this
-- caller, never shortening a window another waiter asked for (the info
-- lives while n > 0; with n 0, behind the line, for the window)
local function wait()
	if ARGV[5] == '1' then
		join(KEYS[4], KEYS[5], token, now, nowMs, ARGV[6], ARGV[2] .. ' ' .. ARGV[7] .. ' ' .. ARGV[4])
		return
	end
	local upto = nowMs + tonumber(ARGV[8])
	local w = tonumber(redis.call('HGET', KEYS[6], 'w'))
	if not w or w < upto then
		redis.call('HSET', KEYS[6], 'w', upto)
		if n == 0 then
			keepFor(KEYS[6], ARGV[8])
		end
	end
end

if n >= tonumber(ARGV[7]) then
	wait()
	local pttl, owner = soonest(KEYS[1], KEYS[6], nowMs)
	return {0, pttl, n, owner}
end

-- A permit is free: the first live waiter in the queue goes first.
local first = firstLive(KEYS[4], KEYS[5], nowMs)
if first and first ~= token then
	wait()
	return {0, -3, n, ''}
end
if first then
	drop(KEYS[4], KEYS[5], token)
end
return {1, admit(KEYS[1], KEYS[6], KEYS[3], token, ARGV[2], ARGV[4], ARGV[7], now, nowMs, ARGV[3], n == 0)}
