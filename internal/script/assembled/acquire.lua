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
