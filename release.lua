-- release: delete the lock only if this token holds it, wake its waiters,
-- and retire the token.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token>
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: the lock key, plus the database number on a
--          database other than 0 (channels are not per database)
-- ARGV[3]  'r' to release a lease, 'a' to abandon an Acquire that gave up,
--          'q' to release a lease on one node of a Redlock quorum
-- ARGV[4]  how long the marker is kept, milliseconds
--
-- The marker retires the token. Written as 'r' whenever the lock is
-- deleted, it makes a release resent after a lost reply report what the
-- first one did. Written as 'a' where the lock was not this token's, for
-- 'a' and 'q', it makes a late copy of an acquire request (acquire.lua,
-- redlock_grant.lua) refuse to take the lock.
--
-- Returns 1 when the lock was ours and is now deleted (by this call or, per
-- the marker, an earlier one), 0 when it does not exist (expired or
-- deleted), -1 when another token holds it; another holder's lock is left
-- alone. When the wake-up could not be published (an ACL without the
-- channel, say), the lock is deleted all the same and the reply is
-- {code, error}: a script's writes are not rolled back, so a failed publish
-- must never turn a delete into an error.
--
-- The wake-up uses sharded pub/sub (SPUBLISH, Redis 7) and falls back to
-- PUBLISH on a server without it; waiters subscribe the same way.

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
elseif ARGV[3] ~= 'r' then
	redis.call('SET', KEYS[2], 'a', 'PX', ARGV[4])
end
if code ~= 1 or ARGV[3] == 'a' then
	-- An abandoned attempt's lock wakes nobody: waiters that it kept out
	-- try again after their backoff, spread out, instead of all at once.
	return code
end
local ok, err = pcall(redis.call, 'SPUBLISH', ARGV[2], 'released')
if not ok then
	local ok2, err2 = pcall(redis.call, 'PUBLISH', ARGV[2], 'released')
	if not ok2 then
		if type(err) == 'table' then err = err.err end
		return {1, tostring(err)}
	end
end
return 1
