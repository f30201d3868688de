-- extend: reset the lock's expiry only if this token holds it. It never
-- recreates a lock that has expired.
--
-- KEYS[1]  lock key
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
--
-- Returns 1 when the expiry was set, 0 when the lock is not ours.

if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
