-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- below reports whether the decimal string a is a smaller number than b
-- (Lua numbers are doubles, which round beyond 2^53).
local function below(a, b)
	return #a < #b or (#a == #b and a < b)
end


-- redlock_fence: record the fence issued to a Redlock lease on one node
-- whose counter was behind it (phase 2 of NewRedlock's acquisition, needed
-- only when the granting nodes' counters had drifted apart), while the
-- lease holds the lock there.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  fence counter
-- ARGV[1]  token
-- ARGV[2]  fence            decimal
-- ARGV[3]  fence retention  milliseconds the counter is kept
--
-- Returns 1 when the counter is now at least the fence and the lock's value
-- holds it, 0 when the lock is not this token's on this node (any more).

local held = redis.call('GET', KEYS[1])
if not holds(held, ARGV[1]) then
	return 0
end
local c = redis.call('GET', KEYS[2])
if not c or below(c, ARGV[2]) then
	redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
	redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. (string.match(held, '^%S+ %S+( .*)$') or ''), 'KEEPTTL')
return 1
