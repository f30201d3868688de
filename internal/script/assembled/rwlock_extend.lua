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

-- extendHeld sets the lock's expiry to ttl if token holds it (held: its
-- value). It returns 1, 0 when the lock does not exist, -1 when another
-- token holds it.
local function extendHeld(lock, held, token, ttl)
	if not held then
		return 0
	end
	if not holds(held, token) then
		return -1
	end
	redis.call('PEXPIRE', lock, ttl)
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

-- keep adds member to a sorted set by expiry, or moves it, to expire at
-- expiry, and makes the key live as long as its longest-lived entry.
local function keep(set, member, expiry, nowMs)
	redis.call('ZADD', set, expiry, member)
	local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
	redis.call('PEXPIRE', set, math.max(tonumber(last) - nowMs, 1))
end

-- rwlock_extend: reset the expiry of a read-write lock's lease (the
-- writer's, or a reader's and its entry in the readers' index) only if
-- this token holds it. It never recreates a lease that has expired.
--
-- KEYS[1]  the lease's key    the writer, or this reader
-- KEYS[2]  the readers' index
-- KEYS[3]  the writer
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
--
-- Returns extend.lua's replies: 1 when the expiry was set, 0 when the
-- lease does not exist (expired or deleted), -1 when another token holds
-- it.

local held = redis.call('GET', KEYS[1])
local code = extendHeld(KEYS[1], held, ARGV[1], ARGV[2])
if code == 1 and KEYS[1] ~= KEYS[3] then
	local nowMs = millis(clock())
	keep(KEYS[2], held, nowMs + tonumber(ARGV[2]), nowMs)
end
return code
