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

-- keepFor makes key live at least ms more, never less, and reports whether
-- it had less: a retry must not undo a longer Extend.
local function keepFor(key, ms)
	if redis.call('PTTL', key) < tonumber(ms) then
		redis.call('PEXPIRE', key, ms)
		return true
	end
	return false
end

-- retired reports whether a token's marker exists (see retire).
local function retired(marker)
	return redis.call('EXISTS', marker) == 1
end


-- line_prelude: a line of fair waiters, after prelude.lua's functions: a
-- sorted set of tokens by arrival (queue) and their entries (a hash).

-- drop takes id out of a line (a sorted set of ids) and its entries.
local function drop(queue, entries, id)
	redis.call('ZREM', queue, id)
	redis.call('HDEL', entries, id)
end


-- redlock_grant: take the lock on one node of a Redlock quorum and count
-- this node's fence counter on (phase 1 of NewRedlock's acquisition). Also
-- puts the lock back on a node that lost it while the lease holds a quorum
-- (a repair, with the lease's fence).
--
-- A repair never stores a fence older than this node has seen: it is
-- refused (busy, {0, -2, ''}) where the node's counter is beyond the
-- lease's fence. The lock then expired here and a newer attempt counted on
-- since, so the lease may hold no quorum any more (a request that reached
-- the node after the lease's deadline; the lock lost on every node, then
-- granted to another and released). A counter that is absent (the node
-- restarted empty, or it expired) allows the repair. One raised by an
-- attempt that got no quorum (another Locker's, given up), or by this
-- lease's own grant that came after its quorum's (quorum.settle), refuses
-- it too, though the lease holds the lock: that is safe, the lease still
-- holds its quorum on the other nodes, only without this one.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token> (see redlock_release.lua)
-- KEYS[3]  fence counter, lock:{name}:fence
-- KEYS[4]  line, lock:{name}:q: waiting Acquire calls by when they joined
--          (TIME, microseconds)
-- KEYS[5]  line entries, lock:{name}:qi: each one's expiry (milliseconds)
-- ARGV[1]  token            random, unique per attempt
-- ARGV[2]  ttl              milliseconds
-- ARGV[3]  fence            "0" for an attempt: the counter is counted on
--                           and its new value stored with the lock; for a
--                           repair, the lease's fence, stored with the lock
--                           and raised into the counter (max); refused
--                           when the counter is beyond it
-- ARGV[4]  owner            who takes the lock, stored with it
-- ARGV[5]  fence retention  milliseconds the counter is kept
-- ARGV[6]  line id          "" for none; on the line's node (the quorum's
--                           first), the id of the waiting Acquire call
--                           this attempt is part of
-- ARGV[7]  entry ttl        milliseconds a line entry lives unless the
--                           call's next attempt comes (its Locker's)
--
-- The line orders wake-ups only (redlock_release.lua names its first live entry):
-- an attempt that finds the lock held joins it, or keeps its place and
-- entry alive; one that gets the lock here leaves it. Nothing here waits
-- for it: any attempt may take a free lock.
--
-- An attempt's counter is one more than it was, or, where it does not
-- exist (never written, expired after the retention, or lost in a restart
-- without persistence) or was not positive, this node's TIME in
-- microseconds. INCR is the script's first write: when it fails (the
-- counter at its maximum, or not a number), nothing is written and its
-- error is the script's.
--
-- Returns
--   {1, fence, time}  the lock is ours (taken now, or already: a resent
--                     request, which never shortens its expiry), with the
--                     fence stored with it here and this node's TIME in
--                     microseconds, both decimal
--                     strings (Lua numbers are doubles); the time dates the
--                     grant for diagnostics (the chaos suite's checker)
--   {0, pttl, owner}  another token holds it (owner as it stored it)
--   {0, -2, ''}       a repair, refused: the lock is free here, but this
--                     node's counter is beyond the lease's fence
--   {0, pttl, owner, ahead}
--                     the same, with a line id: the attempt's call is in
--                     line, with this many entries ahead of it
--   {2}               this token is retired (released, or its attempt
--                     given up): a late request must not take the lock

if retired(KEYS[2]) then
	return {2}
end
local held = redis.call('GET', KEYS[1])
if held then
	if not holds(held, ARGV[1]) then
		if ARGV[6] ~= '' then
			local now = clock()
			local nowMs = millis(now)
			if not redis.call('ZSCORE', KEYS[4], ARGV[6]) then
				redis.call('ZADD', KEYS[4], now, ARGV[6])
			end
			redis.call('HSET', KEYS[5], ARGV[6], string.format('%.0f', nowMs + tonumber(ARGV[7])))
			-- The keys live as long as their longest-lived entry (Lockers
			-- may keep entries for different times): only ever extended.
			for k = 4, 5 do
				if redis.call('PTTL', KEYS[k]) < tonumber(ARGV[7]) then
					redis.call('PEXPIRE', KEYS[k], ARGV[7])
				end
			end
			return {0, redis.call('PTTL', KEYS[1]), ownerOf(held), redis.call('ZRANK', KEYS[4], ARGV[6])}
		end
		return {0, redis.call('PTTL', KEYS[1]), ownerOf(held)}
	end
	keepFor(KEYS[1], ARGV[2]) -- already ours: a resent or late request
	return {1, string.match(held, '^%S+ (%S+)'), (clock())}
end

local fence = ARGV[3]
if fence == '0' then
	local n = redis.call('INCR', KEYS[3])
	if n <= 1 then
		-- No counter here: start it from the clock.
		fence = clock()
		redis.call('SET', KEYS[3], fence, 'PX', ARGV[5])
	else
		if n < 9007199254740992 then
			fence = string.format('%.0f', n)
		else
			fence = redis.call('GET', KEYS[3]) -- exact beyond 2^53
		end
		redis.call('PEXPIRE', KEYS[3], ARGV[5])
	end
else
	local c = redis.call('GET', KEYS[3])
	if c and below(fence, c) then
		return {0, -2, ''} -- a newer grant happened here
	end
	if not c or below(c, fence) then
		redis.call('SET', KEYS[3], fence, 'PX', ARGV[5])
	end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. fence .. ' ' .. ARGV[4], 'PX', ARGV[2])
if ARGV[6] ~= '' then
	drop(KEYS[4], KEYS[5], ARGV[6])
end
return {1, fence, (clock())}
