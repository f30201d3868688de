-- prelude: the functions the scripts share (see assemble_test.go). Locks
-- hold "<token> <fence> <owner>"; times are the server's, from clock.

-- holds reports whether the lock's value held (false: free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- ownerOf returns the owner in the lock's value held, or ''.
local function ownerOf(held)
	return string.match(held, '^%S+ %S+ (.*)$') or ''
end

-- below reports whether the decimal string a is a smaller number than b
-- (Lua numbers are doubles, which round beyond 2^53).
local function below(a, b)
	return #a < #b or (#a == #b and a < b)
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

-- issueFence issues a fence from the counter, kept retention ms: now, or
-- the previous fence plus one when that is more (INCR's exact arithmetic
-- fails at the maximum before writing); it keeps increasing when the
-- counter is lost.
local function issueFence(counter, now, retention)
	local prev = redis.call('SET', counter, now, 'PX', retention, 'GET')
	if prev and not below(prev, now) then
		redis.call('SET', counter, prev, 'PX', retention)
		redis.call('INCR', counter)
		return redis.call('GET', counter)
	end
	return now
end

-- keepFor makes key live at least ms more, never less, and reports whether
-- it had less: a retry must not undo a longer Extend.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
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

-- retired reports whether a token's marker exists (see retire).
local function retired(marker)
	return redis.call('EXISTS', marker) == 1
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
