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

-- clock returns this node's TIME in microseconds, as a decimal string, and
-- in milliseconds.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

if ARGV[5] then
	-- The releasing lease's Acquire leaves this node's Redlock line: it may
	-- have kept its entry alive here while another still held this node.
	redis.call('ZREM', KEYS[3], ARGV[5])
	redis.call('HDEL', KEYS[4], ARGV[5])
end
local code
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
	redis.call('DEL', KEYS[1])
	code = 1
elseif redis.call('GET', KEYS[2]) == 'r' then
	return 1
elseif held then
	code = -1
else
	code = 0
end
if code == 1 then
	redis.call('SET', KEYS[2], 'r', 'PX', ARGV[4])
else
	redis.call('SET', KEYS[2], 'a', 'PX', ARGV[4])
end
if code ~= 1 or ARGV[3] == 'a' then
	return code
end

local message = 'released'
local channel = ARGV[2]
if redis.call('EXISTS', KEYS[3]) == 1 then
	local _, nowMs = clock()
	while true do
		local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
		if not head then
			break
		end
		local expiry = tonumber(redis.call('HGET', KEYS[4], head))
		if expiry and expiry >= nowMs then
			message = 'next ' .. head
			-- Heard by the named call's Locker alone, when the id has its
			-- tag.
			local tag = string.match(head, '^(%x+)%.')
			if tag then
				channel = ARGV[2] .. ':n:' .. tag
			end
			break
		end
		redis.call('ZREM', KEYS[3], head)
		redis.call('HDEL', KEYS[4], head)
	end
end
local ok, err = pcall(redis.call, 'SPUBLISH', channel, message)
if not ok then
	local ok2 = pcall(redis.call, 'PUBLISH', channel, message)
	if not ok2 then
		if type(err) == 'table' then err = err.err end
		return {1, tostring(err)}
	end
end
return 1
