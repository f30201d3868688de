-- force_release: delete a lock whoever holds it, if it still holds the
-- value the command read (and showed), wake its waiters, and retire the
-- holder's token.
--
-- KEYS[1]  lock key, lock:{name}, whose value is "<token> <fence> <owner>"
-- KEYS[2]  the holder's token marker, lock:{name}:t:<token> (same hash tag)
-- ARGV[1]  the lock's value as the command read it
-- ARGV[2]  wake-up channel: the lock key, plus "@<db>" on a database other
--          than 0 (channels are not per database)
-- ARGV[3]  the least time the marker is kept, milliseconds
--
-- Returns
--   {1}         the lock held ARGV[1] and is deleted
--   {1, error}  the same, but the wake-up could not be published (an ACL
--               without the channel, say): the delete stands
--   {0, value}  the lock no longer holds ARGV[1]; value is what it holds
--               now, '' when it is free; nothing was changed
--
-- The fence counter (lock:{name}:fence) is left as it is, so the next
-- holder's fence is greater than the deleted holder's.
--
-- The marker 'a' retires the holder's token, as release.lua does for an
-- Acquire that gave up: a late copy of the holder's acquire request cannot
-- take the lock again. The holder's Extend and Release then find the lock
-- gone (ErrNotHeld), and its watchdog cancels its work with ErrLost. The
-- marker is kept while the deleted lock would have lived, at least ARGV[3].
--
-- The wake-up is published like release.lua's, SPUBLISH (Redis 7) with a
-- PUBLISH fallback, with the payload 'forced' instead of 'released':
-- waiters wake on any message, and fencelock watch tells the two apart.

local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] then
	return {0, held or ''}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < tonumber(ARGV[3]) then
	ttl = ARGV[3]
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], 'a', 'PX', ttl)
local ok, err = pcall(redis.call, 'SPUBLISH', ARGV[2], 'forced')
if not ok then
	local ok2 = pcall(redis.call, 'PUBLISH', ARGV[2], 'forced')
	if not ok2 then
		if type(err) == 'table' then err = err.err end
		return {1, tostring(err)}
	end
end
return {1}
