-- release: delete the lock only if this token holds it, and wake its waiters.
--
-- KEYS[1]  lock key; also the name of the wake-up channel (channels and keys
--          are separate namespaces; on Redis Cluster the channel lives on the
--          key's shard)
-- ARGV[1]  token
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
if not pcall(redis.call, 'SPUBLISH', KEYS[1], 'released') then
	redis.call('PUBLISH', KEYS[1], 'released')
end
return 1
