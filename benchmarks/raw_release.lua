-- raw_release: the baseline's compare-and-delete (the canonical pattern from
-- the Redis documentation on SET NX locks).
--
-- KEYS[1]  lock key
-- ARGV[1]  token set by SET NX
--
-- Returns 1 when the lock held ARGV[1] and is now deleted, 0 otherwise.

if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
