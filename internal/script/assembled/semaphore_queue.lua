-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

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


-- semaphore_queue: a fair waiter's keep-alive, or its departure, in a
-- semaphore's line. It answers as queue.lua does, which fair.go reads.
--
-- KEYS[1]  holders, lock:{name}:sem (see semaphore_acquire.lua)
-- KEYS[2]  queue, lock:{name}:sem:q
-- KEYS[3]  queue entries, lock:{name}:sem:qi
-- KEYS[4]  info, lock:{name}:sem:h
-- ARGV[1]  token
-- ARGV[2]  'k' to keep the waiter's entry alive, 'd' to leave the queue
-- ARGV[3]  entry ttl, milliseconds
-- ARGV[4]  ttl of the permit, milliseconds, for a grant
-- ARGV[5]  owner, for a grant
-- ARGV[6]  the Semaphore's number of permits
--
-- Returns
--   {1, fence, pttl}  a release granted this token a permit: the waiter
--               holds it, for pttl more milliseconds; for 'd', the caller
--               must release it, which hands it on
--   {0, pttl}   'k': still waiting, the entry kept alive, and when the
--               first permit expires (-2: one is free, a waiter ahead of
--               this one takes it)
--   {0}         'd': left
--   {3}         'k': the entry is gone (it expired, or a release dropped
--               it): join again
--   {4}         'k': a permit is free and this waiter is first in line:
--               take it (semaphore_acquire.lua)

local token = ARGV[1]
local nowMs = millis(clock())
local expiry = redis.call('ZSCORE', KEYS[1], token)
local held = expiry and tonumber(expiry) >= nowMs and redis.call('HGET', KEYS[4], token)
if held then
	drop(KEYS[2], KEYS[3], token)
	return {1, string.match(held, '^(%d+)'), tonumber(expiry) - nowMs}
end
local reply = outOfLine(KEYS[2], KEYS[3], token, ARGV[2])
if reply then
	return reply
end
keepEntry(KEYS[2], KEYS[3], token, nowMs, ARGV[3], ARGV[4] .. ' ' .. ARGV[6] .. ' ' .. ARGV[5])
local n = prune(KEYS[1], KEYS[4], nowMs, false)
local permits = tonumber(n > 0 and redis.call('HGET', KEYS[4], 'n') or ARGV[6])
if n < permits then
	return whenFree(KEYS[2], KEYS[3], token, nowMs)
end
return {0, (soonest(KEYS[1], KEYS[4], nowMs))}
