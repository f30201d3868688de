-- rwlock_prelude: the functions the read-write lock's scripts share (see
-- assemble_test.go).
--
-- A read-write lock's keys share the name's hash tag: the writer
-- lock:{name}:rw:w and each reader lock:{name}:rw:r:<token>, both holding
-- "<token> <fence> <owner>" with the lease's TTL; the readers' index
-- lock:{name}:rw:r, a sorted set of the readers' values by their expiry
-- (server time in ms); the waiting writers' intents lock:{name}:rw:i, a
-- sorted set of their tokens by expiry; and the fence counter
-- lock:{name}:rw:fence.

-- live prunes the entries of a sorted set by expiry that have expired
-- before nowMs, and returns how many are left.
local function live(set, nowMs)
	redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. nowMs)
	return redis.call('ZCARD', set)
end

-- keep adds member to a sorted set by expiry, or moves it, to expire at
-- expiry, and makes the key live as long as its longest-lived entry.
local function keep(set, member, expiry, nowMs)
	redis.call('ZADD', set, expiry, member)
	local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
	redis.call('PEXPIRE', set, math.max(tonumber(last) - nowMs, 1))
end
