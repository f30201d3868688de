-- release: delete the lock only if this token holds it, and wake its waiters.
--
-- KEYS[1]  lock key
-- ARGV[1]  token
-- ARGV[2]  wake-up channel (same hash tag as the key, so on Redis Cluster it
--          lives on the key's shard; a channel, not a key)
--
-- Returns 1 when the lock was ours and is now deleted, 0 otherwise (expired,
-- taken over, deleted); another holder's lock is left alone.
--
-- The wake-up uses sharded pub/sub (SPUBLISH, Redis 7) and falls back to
-- PUBLISH on a server without it; waiters subscribe the same way.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
if not pcall(redis.call, 'SPUBLISH', ARGV[2], 'released') then
	redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
