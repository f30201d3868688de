-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- clock returns this node's TIME in microseconds, as a decimal string.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- millis returns a time of clock's in milliseconds, as an exact number.
local function millis(micros)
	return math.floor(tonumber(micros) / 1000)
end

-- retire writes a token's marker, kept ms: 'r' where this call deleted the
-- lock, so that a release resent after a lost reply reports what the first
-- did (unlock); with refuse, 'a' where the lock was not the token's. Either
-- refuses a late copy of the token's acquire (retired).
local function retire(marker, code, deleted, refuse, ms)
	if deleted then
		redis.call('SET', marker, 'r', 'PX', ms)
	elseif code ~= 1 and refuse then
		redis.call('SET', marker, 'a', 'PX', ms)
	end
end

-- unlock deletes the lock if token holds it. It returns 1 when the lock was
-- token's (deleted: by this call), -1 when another token holds it, 0 when
-- it does not exist.
local function unlock(lock, marker, token)
	local held = redis.call('GET', lock)
	if holds(held, token) then
		redis.call('DEL', lock)
		return 1, true
	elseif redis.call('GET', marker) == 'r' then
		return 1, false
	elseif held then
		return -1, false
	end
	return 0, false
end

-- publish publishes message on channel (SPUBLISH; PUBLISH before Redis 7),
-- and returns a release's reply: 1, or {1, error} when it could not (the
-- script's writes stand).
local function publish(channel, message)
	local ok, err = pcall(redis.call, 'SPUBLISH', channel, message)
	if not ok then
		local ok2 = pcall(redis.call, 'PUBLISH', channel, message)
		if not ok2 then
			if type(err) == 'table' then err = err.err end
			return {1, tostring(err)}
		end
	end
	return 1
end

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


-- rwlock_release: delete a read-write lock's lease (the writer's, or a
-- reader's and its entry in the readers' index) only if this token holds
-- it, take the token's intent out if it was a waiting writer's, and retire
-- the token, as release.lua does for a lock.
--
-- KEYS[1]  the lease's key    the writer, or this reader
-- KEYS[2]  token marker
-- KEYS[3]  the readers' index
-- KEYS[4]  the waiting writers' intents
-- KEYS[5]  the writer
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: lock:{name}:rw, plus the database number on a
--          database other than 0
-- ARGV[3]  'r' to release a lease, 'a' to abandon an Acquire that gave up
-- ARGV[4]  how long the marker is kept, milliseconds
--
-- "released" is published when the waiters may now enter: the writer
-- left (readers, and writers, may), the last reader left (a writer may),
-- or a waiting writer gave up (readers may).
--
-- Returns release.lua's replies: 1, 0 or -1, or {1, error} when the lease
-- was deleted but the wake-up could not be published.

local held = redis.call('GET', KEYS[1])
local code, deleted = unlock(KEYS[1], KEYS[2], ARGV[1])
retire(KEYS[2], code, deleted, ARGV[3] ~= 'r', ARGV[4])

local wake = redis.call('ZREM', KEYS[4], ARGV[1]) == 1
if deleted and KEYS[1] == KEYS[5] then
	wake = true
elseif deleted then
	redis.call('ZREM', KEYS[3], held)
	local nowMs = millis(clock())
	wake = wake or live(KEYS[3], nowMs) == 0
end
if not wake then
	return code
end
local published = publish(ARGV[2], 'released')
if code == 1 then
	return published
end
return code
