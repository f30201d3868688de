-- extend: reset the lock's expiry only if this token holds it. It never
-- recreates a lock that has expired.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- ARGV[1]  token
-- ARGV[2]  ttl, milliseconds
--
-- Returns 1 when the expiry was set, 0 when the lock does not exist
-- (expired or deleted), -1 when another token holds it.

local held = redis.call('GET', KEYS[1])
return extendHeld(KEYS[1], held, ARGV[1], ARGV[2])
