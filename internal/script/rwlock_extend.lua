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
