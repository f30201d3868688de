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
