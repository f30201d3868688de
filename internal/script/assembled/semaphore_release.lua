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

-- retire writes a token's marker, kept ms: 'r' where this call deleted the
-- lock, so that a release resent after a lost reply reports what the first
-- did (unlock); with refuse, 'a' where the lock was not the token's. Either
-- refuses a late copy of the token's acquire (retired).
local function retire(marker, code, deleted, refuse, ms)
	if deleted then
		redis.call('SET', marker, 'r', 'PX', ms)
	elseif code ~= 1 and refuse then
		redis.call('SET', marker, 'a', 'PX', ms)
	end
end

-- publish publishes message on channel (SPUBLISH; PUBLISH before Redis 7),
-- and returns a release's reply: 1, or {1, error} when it could not (the
-- script's writes stand).
local function publish(channel, message)
	local ok, err = pcall(redis.call, 'SPUBLISH', channel, message)
	if not ok then
		local ok2 = pcall(redis.call, 'PUBLISH', channel, message)
		if not ok2 then
			if type(err) == 'table' then err = err.err end
			return {1, tostring(err)}
		end
	end
	return 1
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
