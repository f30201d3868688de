-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- ownerOf returns the owner in the lock's value held, or ''.
local function ownerOf(held)
	return string.match(held, '^%S+ %S+ (.*)$') or ''
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
