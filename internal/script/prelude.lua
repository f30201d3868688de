-- prelude: the functions the scripts share; each script gets those it
-- calls, put before its source (see newScript in scripts.go). It calls
-- Redis only when a script calls one of them.

-- holds reports whether the lock's value held ("<token> <fence> <owner>",
-- false when the lock is free) is token's.
local function holds(held, token)
	return held and string.sub(held, 1, #token + 1) == token .. ' '
end

-- ownerOf returns the owner stored in the lock's value held, or ''.
local function ownerOf(held)
	return string.match(held, '^%S+ %S+ (.*)$') or ''
end

-- below reports whether the decimal string a is a smaller number than b
-- (both without sign or leading zeros; Lua numbers are doubles, which round
-- beyond 2^53).
local function below(a, b)
	return #a < #b or (#a == #b and a < b)
end

-- clock returns this node's TIME in microseconds, as a decimal string.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- millis returns a time in microseconds (a decimal string, as clock's) in
-- milliseconds, as a number: exact, as such times are below 2^53. Apart
-- from clock: the conversion costs about 2,000 instructions, 3 % of an
-- acquire of a free lock, which needs none.
local function millis(micros)
	return math.floor(tonumber(micros) / 1000)
end

-- issueFence issues a fence from the counter key: the previous fence plus
-- one, floored by now (clock's microseconds), so that it keeps increasing
-- when the counter is lost or has expired; the counter is kept for
-- retention milliseconds. Nothing is written when the counter cannot be
-- incremented (at its maximum: INCR fails before writing, and its error is
-- the script's).
local function issueFence(counter, now, retention)
	local prev = redis.call('SET', counter, now, 'PX', retention, 'GET')
	if prev and not below(prev, now) then
		-- The counter is ahead of the clock (several fences within one
		-- microsecond, or a server clock that stepped back): put it back and
		-- count on from it, with INCR's exact 64-bit arithmetic, which fails
		-- at the maximum (or on a value that is not a number).
		redis.call('SET', counter, prev, 'PX', retention)
		redis.call('INCR', counter)
		return redis.call('GET', counter)
	end
	return now
end

-- keepFor makes key live at least ms more milliseconds, and reports
-- whether it had less: it never shortens a life. A holder's key is reset
-- with it when a request of its token comes again (a retry after a lost
-- reply, or a late copy): an Extend to a longer TTL may have come first.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
end

-- retire writes a token's marker (its lock's KEYS[2] in the scripts,
-- lock:{name}:t:<token> for a lock), kept ms milliseconds, once a release
-- or an abandoned Acquire is done with the lease: the token is retired from
-- then on (see retired). It is written as 'r' where this call deleted the
-- lease (deleted), so that a release resent after a lost reply reports
-- what the first one did (see unlock); with refuse set, as 'a' where the
-- lease was not the token's (code is not 1), so that a late copy of the
-- token's acquire request refuses to take the lock.
local function retire(marker, code, deleted, refuse, ms)
	if deleted then
		redis.call('SET', marker, 'r', 'PX', ms)
	elseif code ~= 1 and refuse then
		redis.call('SET', marker, 'a', 'PX', ms)
	end
end

-- retired reports whether a token's marker exists (see retire): an acquire
-- request of a retired token must not take the lock (the scripts' {2}).
local function retired(marker)
	return redis.call('EXISTS', marker) == 1
end

-- extendHeld resets the lock's expiry to ttl milliseconds only if token
-- holds it (held: the lock's value, false when it does not exist); it
-- never recreates a lock that has expired. It returns extend.lua's reply: 1
-- when the expiry was set, 0 when the lock does not exist (expired or
-- deleted), -1 when another token holds it.
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
-- token's (deleted is true when this call deleted it; false when the marker
-- says an earlier release did, see retire), -1 when another token holds it,
-- 0 when it does not exist.
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

-- publish publishes message on channel, with sharded pub/sub (SPUBLISH,
-- Redis 7) or, on a server without it, PUBLISH, and returns a release's
-- reply: 1, or {1, error} when it could not be published (a script's writes
-- are not rolled back: a failed publish must never turn a release into an
-- error).
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

-- drop takes id out of a queue and its entries.
local function drop(queue, entries, id)
	redis.call('ZREM', queue, id)
	redis.call('HDEL', entries, id)
end

-- firstLive returns the first live entry of a queue (a sorted set of ids)
-- and its value in entries (a hash of the ids), or nil; the dead entries
-- before it are dropped. An entry lives while its value's leading number,
-- its expiry (server time in milliseconds), is at least nowMs.
local function firstLive(queue, entries, nowMs)
	while true do
		local head = redis.call('ZRANGE', queue, 0, 0)[1]
		if not head then
			return nil
		end
		local entry = redis.call('HGET', entries, head)
		local expiry = entry and tonumber(string.match(entry, '^(%d+)'))
		if expiry and expiry >= nowMs then
			return head, entry
		end
		drop(queue, entries, head)
	end
end

-- keepEntry writes token's entry in a queue's entries, "<expiry> <rest>",
-- the expiry entryTTL milliseconds after nowMs (until then the entry lives
-- without a keep-alive, see firstLive), and makes the queue and its
-- entries live entryTTL milliseconds more.
local function keepEntry(queue, entries, token, nowMs, entryTTL, rest)
	redis.call('HSET', entries, token, (nowMs + tonumber(entryTTL)) .. ' ' .. rest)
	redis.call('PEXPIRE', queue, entryTTL)
	redis.call('PEXPIRE', entries, entryTTL)
end

-- join puts a fair waiter at the end of a queue, by now (clock's
-- microseconds: the queue is in the order its waiters joined), unless it is
-- in it already, and keeps its entry (keepEntry).
local function join(queue, entries, token, now, nowMs, entryTTL, rest)
	if not redis.call('ZSCORE', queue, token) then
		redis.call('ZADD', queue, now, token)
	end
	keepEntry(queue, entries, token, nowMs, entryTTL, rest)
end

-- outOfLine answers the keep-alive ('k') or the departure ('d') of a fair
-- waiter that was granted nothing (mode: queue.lua's ARGV[2]): for 'd', it
-- takes the waiter out of the queue and returns {0}; for 'k', it returns
-- {3} when the waiter is no longer in the queue (its entry expired, or a
-- release dropped it: it must join again), and nil when it is (the caller
-- keeps its entry alive).
local function outOfLine(queue, entries, token, mode)
	if mode == 'd' then
		drop(queue, entries, token)
		return {0}
	end
	if not redis.call('ZSCORE', queue, token) then
		return {3}
	end
end

-- whenFree answers the keep-alive of a fair waiter, its entry kept alive,
-- that finds the lock (or a permit) free: its holder's lease expired, and
-- no release handed it over. It returns {4} when the waiter is the first
-- live one in line (it takes the lock), {3} when no entry lives (it must
-- join again), and {0, -2} when a waiter ahead of it takes the lock.
local function whenFree(queue, entries, token, nowMs)
	local first = firstLive(queue, entries, nowMs)
	if first == token then
		return {4}
	end
	if not first then
		return {3}
	end
	return {0, -2}
end
