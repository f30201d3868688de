-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- below reports whether the decimal string a is a smaller number than b
-- (Lua numbers are doubles, which round beyond 2^53).
local function below(a, b)
	return #a < #b or (#a == #b and a < b)
end

-- clock returns this node's TIME in microseconds, as a decimal string.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- millis returns a time of clock's in milliseconds, as an exact number.
local function millis(micros)
	return math.floor(tonumber(micros) / 1000)
end

-- issueFence issues a fence from the counter, kept retention ms: now, or
-- the previous fence plus one when that is more (INCR's exact arithmetic
-- fails at the maximum before writing); it keeps increasing when the
-- counter is lost.
local function issueFence(counter, now, retention)
	local prev = redis.call('SET', counter, now, 'PX', retention, 'GET')
	if prev and not below(prev, now) then
		redis.call('SET', counter, prev, 'PX', retention)
		redis.call('INCR', counter)
		return redis.call('GET', counter)
	end
	return now
end

-- keepFor makes key live at least ms more, never less, and reports whether
-- it had less: a retry must not undo a longer Extend.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
end

-- retired reports whether a token's marker exists (see retire).
local function retired(marker)
	return redis.call('EXISTS', marker) == 1
end


-- line_prelude: a line of fair waiters, after prelude.lua's functions: a
-- sorted set of tokens by arrival (queue) and their entries (a hash).

-- drop takes id out of a line (a sorted set of ids) and its entries.
local function drop(queue, entries, id)
	redis.call('ZREM', queue, id)
	redis.call('HDEL', entries, id)
end

-- firstLive returns the line's first live entry, its id and value, or nil,
-- dropping the dead ones before it. An entry lives while its value's
-- leading number, its expiry in ms, is at least nowMs.
local function firstLive(queue, entries, nowMs)
	while true do
		local head = redis.call('ZRANGE', queue, 0, 0)[1]
		if not head then
			return nil
		end
		local entry = redis.call('HGET', entries, head)
		local expiry = entry and tonumber(string.match(entry, '^(%d+)'))
		if expiry and expiry >= nowMs then
			return head, entry
		end
		drop(queue, entries, head)
	end
end

-- keepEntry writes token's entry, "<expiry> <rest>", living entryTTL ms
-- from nowMs, and makes the line and its entries live as long.
local function keepEntry(queue, entries, token, nowMs, entryTTL, rest)
	redis.call('HSET', entries, token, (nowMs + tonumber(entryTTL)) .. ' ' .. rest)
	redis.call('PEXPIRE', queue, entryTTL)
	redis.call('PEXPIRE', entries, entryTTL)
end

-- join puts a fair waiter at the end of a line, by now, unless it is in it
-- already, and keeps its entry.
local function join(queue, entries, token, now, nowMs, entryTTL, rest)
	if not redis.call('ZSCORE', queue, token) then
		redis.call('ZADD', queue, now, token)
	end
	keepEntry(queue, entries, token, nowMs, entryTTL, rest)
end


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
