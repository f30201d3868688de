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


-- redlock_release: on one node of a Redlock quorum, delete the lock only if
-- this token holds it and retire the token; name the first live entry of
-- the node's line, whose Acquire alone tries next.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token>
-- KEYS[3]  line, lock:{name}:q (see redlock_grant.lua)
-- KEYS[4]  line entries, lock:{name}:qi (see redlock_grant.lua)
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: the lock key, plus the database number on a
--          database other than 0 (channels are not per database)
-- ARGV[3]  'r' to release a lease, 'a' to abandon an attempt (it wakes
--          nobody, so that contenders that split the quorum retry after
--          their backoff)
-- ARGV[4]  how long the marker is kept, milliseconds
-- ARGV[5]  optional, on the quorum's first node: the line id of the Acquire
--          that took the lease, or that gave up; it leaves the node's line
--          in the same step as its token is retired, so that a late attempt
--          does not put it back
--
-- The marker retires the token, as in release.lua; here it is written as
-- 'a' also for 'r' where the lock was not this token's: a grant still in
-- flight to a slow node must not take the lock.
--
-- When the lock was deleted by 'r', "next <id>" names the first live entry
-- of the line (nothing is handed over: the line orders wake-ups only); it
-- is published on the channel plus ":n:" and the id's tag (the hex digits
-- before its first dot, the named call's Locker's), which only that Locker
-- hears, or on the channel itself for an id without one. With no live
-- entry, "released" is published.
--
-- Returns what release.lua returns: 1, 0, -1, or {1, error} when the
-- message could not be published.

if ARGV[5] then
	-- The releasing lease's Acquire leaves this node's Redlock line: it may
	-- have kept its entry alive here while another still held this node.
	drop(KEYS[3], KEYS[4], ARGV[5])
end
local code, deleted = unlock(KEYS[1], KEYS[2], ARGV[1])
retire(KEYS[2], code, deleted, true, ARGV[4])
if not deleted or ARGV[3] == 'a' then
	return code
end

local message = 'released'
local channel = ARGV[2]
if redis.call('EXISTS', KEYS[3]) == 1 then
	local nowMs = millis(clock())
	local head = firstLive(KEYS[3], KEYS[4], nowMs)
	if head then
		message = 'next ' .. head
		-- Heard by the named call's Locker alone, when the id has its tag.
		local tag = string.match(head, '^(%x+)%.')
		if tag then
			channel = ARGV[2] .. ':n:' .. tag
		end
	end
end
return publish(channel, message)
