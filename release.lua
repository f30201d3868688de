-- release: delete the lock only if this token holds it.
--
-- KEYS[1]  lock key
-- ARGV[1]  token
--
-- Returns 1 when the lock was ours and is now deleted, 0 otherwise (expired,
-- taken over, deleted); another holder's lock is left alone.

if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
