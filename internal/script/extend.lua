-- extend: reset the lock's expiry (KEYS[1]) to ttl (ARGV[2], ms) if the
-- token (ARGV[1]) holds it; it never recreates an expired lock. Returns 1,
-- 0 when the lock does not exist, -1 when another token holds it.

local held = redis.call('GET', KEYS[1])
return extendHeld(KEYS[1], held, ARGV[1], ARGV[2])
