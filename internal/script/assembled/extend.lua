-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
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


-- extend: reset the lock's expiry (KEYS[1]) to ttl (ARGV[2], ms) if the
-- token (ARGV[1]) holds it; it never recreates an expired lock. Returns 1,
-- 0 when the lock does not exist, -1 when another token holds it.

local held = redis.call('GET', KEYS[1])
return extendHeld(KEYS[1], held, ARGV[1], ARGV[2])
