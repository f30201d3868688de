-- force_release_permit: free one holder's permit of a semaphore, whoever
-- holds it, if it still holds what the command read (and showed), wake the
-- semaphore's waiters, and retire the holder's token.
--
-- KEYS[1]  the semaphore's holders, lock:{name}:sem, a sorted set of the
--          holders' tokens by the server time (ms) their permits expire at
-- KEYS[2]  its holders' info, lock:{name}:sem:h: each token's
--          "<fence> <owner>"
-- KEYS[3]  the holder's token marker, lock:{name}:sem:t:<token>
-- ARGV[1]  the holder's token
-- ARGV[2]  its "<fence> <owner>" as the command read it
-- ARGV[3]  wake-up channel: the holders key, plus "@<db>" on a database
--          other than 0
-- ARGV[4]  the least time the marker is kept, milliseconds
--
-- Returns
--   {1}         the permit was the holder's and is freed
--   {1, error}  the same, but the wake-up could not be published: the free
--               stands
--   {0, value}  the holder no longer holds it (given back, expired, or
--               another permit of its token): nothing was changed
--
-- As force_release.lua does for a lock: the fence counter stays, the marker
-- 'a' keeps a late copy of the holder's acquire request from taking a
-- permit, the holder finds its permit gone at its next renewal (ErrNotHeld;
-- RunWithLock cancels its work with ErrLost), and 'forced' is published:
-- plain waiters try again, fair ones ask, and the first in line takes it.

local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
local value = redis.call('HGET', KEYS[2], ARGV[1])
if not expiry or tonumber(expiry) < nowMs or value ~= ARGV[2] then
	return {0, value or ''}
end
local ttl = math.max(tonumber(expiry) - nowMs, tonumber(ARGV[4]))
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then
	redis.call('DEL', KEYS[2])
end
redis.call('SET', KEYS[3], 'a', 'PX', ttl)
local ok, err = pcall(redis.call, 'SPUBLISH', ARGV[3], 'forced')
if not ok then
	local ok2 = pcall(redis.call, 'PUBLISH', ARGV[3], 'forced')
	if not ok2 then
		if type(err) == 'table' then err = err.err end
		return {1, tostring(err)}
	end
end
return {1}
