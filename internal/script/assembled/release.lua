-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

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
-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

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

-- unlock deletes the lock if token holds it. It returns 1 when the lock was
-- token's (deleted: by this call), -1 when another token holds it, 0 when
-- it does not exist.
local function unlock(lock, marker, token)
	local held = redis.call('GET', lock)
	if holds(held, token) then
		redis.call('DEL', lock)
		return 1, true
	elseif redis.call('GET', marker) == 'r' then
		return 1, false
	elseif held then
		return -1, false
	end
	return 0, false
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
