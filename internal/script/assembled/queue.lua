-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
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

-- outOfLine answers the keep-alive ('k') or the departure ('d', mode) of a
-- fair waiter granted nothing: for 'd', it takes the waiter out of line and
-- returns {0}; for 'k', {3} when it is out of line (its entry expired, or a
-- release dropped it: it joins again), nil when it is in it.
local function outOfLine(queue, entries, token, mode)
	if mode == 'd' then
		drop(queue, entries, token)
		return {0}
	end
	if not redis.call('ZSCORE', queue, token) then
		return {3}
	end
end

-- whenFree answers the keep-alive of a fair waiter in line that finds the
-- lock (or a permit) free, its holder's lease expired: {4} when it is the
-- first live waiter (it takes the lock), {3} when no entry lives (it joins
-- again), {0, -2} when a waiter ahead takes it.
local function whenFree(queue, entries, token, nowMs)
	local first = firstLive(queue, entries, nowMs)
	if first == token then
		return {4}
	end
	if not first then
		return {3}
	end
	return {0, -2}
end

-- queue: a fair waiter's keep-alive, or its departure.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  queue, lock:{name}:q (see acquire.lua)
-- KEYS[3]  queue entries, lock:{name}:qi (see acquire.lua)
-- ARGV[1]  token
-- ARGV[2]  'k' to keep the waiter's entry alive, 'd' to leave the queue
-- ARGV[3]  entry ttl, milliseconds
-- ARGV[4]  ttl of the lock, milliseconds, for a grant
-- ARGV[5]  owner, for a grant
--
-- Returns
--   {1, fence, pttl}  the lock was granted to this token (a release handed
--               it over): the waiter holds it, for pttl more milliseconds;
--               for 'd', the caller must release it, which hands it on
--   {0, pttl}   'k': still waiting, the entry kept alive, and the lock's
--               PTTL (-2: free, a waiter ahead of this one takes it)
--   {0}         'd': left
--   {3}         'k': the entry is gone (it expired): join again
--   {4}         'k': the lock is free and this waiter is first in line:
--               take it (acquire.lua)

local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
if holds(held, token) then
	drop(KEYS[2], KEYS[3], token)
	return {1, string.match(held, '^(%d+)', #token + 2), redis.call('PTTL', KEYS[1])}
end
local reply = outOfLine(KEYS[2], KEYS[3], token, ARGV[2])
if reply then
	return reply
end
local nowMs = millis(clock())
keepEntry(KEYS[2], KEYS[3], token, nowMs, ARGV[3], ARGV[4] .. ' ' .. ARGV[5])
if not held then
	return whenFree(KEYS[2], KEYS[3], token, nowMs)
end
return {0, redis.call('PTTL', KEYS[1])}
