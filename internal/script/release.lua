-- release: delete the lock only if this token holds it and retire the
-- token; hand the lock to the first fair waiter in line, or wake the
-- waiters. A node of a Redlock quorum has its own (redlock_release.lua).
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token>
-- KEYS[3]  fence counter, lock:{name}:fence
-- KEYS[4]  queue, lock:{name}:q (see acquire.lua)
-- KEYS[5]  queue entries, lock:{name}:qi (see acquire.lua)
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: the lock key, plus the database number on a
--          database other than 0 (channels are not per database)
-- ARGV[3]  'r' to release a lease, 'a' to abandon an Acquire that gave up
-- ARGV[4]  how long the marker is kept, milliseconds
-- ARGV[5]  fence retention, milliseconds
-- ARGV[6]  optional: '1' to publish "released" even when no connection
--          subscribes to the channel (to try the permission)
--
-- The marker retires the token (see retire in prelude.lua): it is written
-- as 'r' whenever the lock is deleted, and as 'a' where the lock was not
-- this token's, for 'a', so that a late copy of an acquire request
-- (acquire.lua) refuses to take the lock.
--
-- When the lock was deleted and a fair waiter is in line (its queue entry
-- kept alive), the lock is granted to the first one in the same step: set
-- to its token with its TTL and owner, with a fence issued as acquire.lua
-- issues them, and "granted <token> <fence>" is published; the waiter holds
-- the lock when the message arrives. Otherwise "released" is published,
-- for 'a' too: an attempt given up, or a fair waiter that left the line
-- after a grant, held the lock, and waiters saw it busy.
--
-- "released" is published only when someone may be waiting: not when no
-- connection subscribes to the channel on this node (PUBSUB SHARDNUMSUB,
-- where waiters subscribe); a waiter that has not subscribed yet tries
-- again when its subscription is confirmed. On a server without sharded
-- pub/sub, or where the count is refused, it is published.
--
-- Returns 1 when the lock was ours and is now deleted (by this call or, per
-- the marker, an earlier one), 0 when it does not exist (expired or
-- deleted), -1 when another token holds it; another holder's lock is left
-- alone. When the message could not be published (an ACL without the
-- channel, say), the lock is released all the same and the reply is
-- {code, error}: a script's writes are not rolled back, so a failed publish
-- must never turn a release into an error.
--
-- Messages use sharded pub/sub (SPUBLISH, Redis 7) and fall back to PUBLISH
-- on a server without it; waiters subscribe the same way.

local code, deleted = unlock(KEYS[1], KEYS[2], ARGV[1])
retire(KEYS[2], code, deleted, ARGV[3] ~= 'r', ARGV[4])
if not deleted then
	return code
end

local message = 'released'
if redis.call('EXISTS', KEYS[4]) == 1 then
	local now = clock()
	local nowMs = millis(now)
	while true do
		-- The first live waiter leaves the queue and gets the lock, with
		-- its TTL and owner (an entry in another shape is dropped).
		local head, entry = firstLive(KEYS[4], KEYS[5], nowMs)
		if not head then
			break
		end
		drop(KEYS[4], KEYS[5], head)
		local ttl, owner = string.match(entry, '^%d+ (%d+) (.*)$')
		if ttl then
			local fence = issueFence(KEYS[3], now, ARGV[5])
			redis.call('SET', KEYS[1], head .. ' ' .. fence .. ' ' .. owner, 'PX', ttl)
			message = 'granted ' .. head .. ' ' .. fence
			break
		end
	end
end
if message == 'released' then
	if ARGV[6] ~= '1' then
		local ok, subscribed = pcall(redis.call, 'PUBSUB', 'SHARDNUMSUB', ARGV[2])
		if ok and subscribed[2] == 0 then
			return code -- nobody listens here
		end
	end
end
return publish(ARGV[2], message)
