-- release: delete the lock only if this token holds it and retire the
-- token; hand the lock to the first fair waiter in line, or wake the
-- waiters. A node of a Redlock quorum has its own (redlock_release.lua).
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  token marker, lock:{name}:t:<token>
-- KEYS[3]  fence counter, lock:{name}:fence
-- KEYS[4]  queue, lock:{name}:q (see acquire.lua)
-- KEYS[5]  queue entries, lock:{name}:qi (see acquire.lua)
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: the lock key, plus the database number on a
--          database other than 0 (channels are not per database)
-- ARGV[3]  'r' to release a lease, 'a' to abandon an Acquire that gave up
-- ARGV[4]  how long the marker is kept, milliseconds
-- ARGV[5]  fence retention, milliseconds
--
-- The marker retires the token. Written as 'r' whenever the lock is
-- deleted, it makes a release resent after a lost reply report what the
-- first one did. Written as 'a' where the lock was not this token's, for
-- 'a', it makes a late copy of an acquire request (acquire.lua) refuse to
-- take the lock.
--
-- When the lock was deleted and a fair waiter is in line (its queue entry
-- kept alive), the lock is granted to the first one in the same step: set
-- to its token with its TTL and owner, with a fence issued as acquire.lua
-- issues them, and "granted <token> <fence>" is published; the waiter holds
-- the lock when the message arrives. Otherwise "released" is published
-- (except for 'a': an abandoned attempt's lock wakes nobody).
--
-- Returns 1 when the lock was ours and is now deleted (by this call or, per
-- the marker, an earlier one), 0 when it does not exist (expired or
-- deleted), -1 when another token holds it; another holder's lock is left
-- alone. When the message could not be published (an ACL without the
-- channel, say), the lock is released all the same and the reply is
-- {code, error}: a script's writes are not rolled back, so a failed publish
-- must never turn a release into an error.
--
-- Messages use sharded pub/sub (SPUBLISH, Redis 7) and fall back to PUBLISH
-- on a server without it; waiters subscribe the same way.

-- clock returns this node's TIME in microseconds, as a decimal string, and
-- in milliseconds.
local function clock()
	local t = redis.call('TIME')
	return t[1] .. string.rep('0', 6 - #t[2]) .. t[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local code
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
	redis.call('DEL', KEYS[1])
	code = 1
elseif redis.call('GET', KEYS[2]) == 'r' then
	return 1
elseif held then
	code = -1
else
	code = 0
end
if code == 1 then
	redis.call('SET', KEYS[2], 'r', 'PX', ARGV[4])
elseif ARGV[3] ~= 'r' then
	redis.call('SET', KEYS[2], 'a', 'PX', ARGV[4])
end
if code ~= 1 then
	return code
end

local message = 'released'
local channel = ARGV[2]
if redis.call('EXISTS', KEYS[4]) == 1 then
	local now, nowMs = clock()
	while true do
		local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
		if not head then
			break
		end
		local entry = redis.call('HGET', KEYS[5], head)
		redis.call('ZREM', KEYS[4], head)
		redis.call('HDEL', KEYS[5], head)
		local expiry, ttl, owner = string.match(entry or '', '^(%d+) (%d+) (.*)$')
		if expiry and tonumber(expiry) >= nowMs then
			-- The fence, as acquire.lua issues it.
			local fence = now
			local prev = redis.call('SET', KEYS[3], now, 'PX', ARGV[5], 'GET')
			if prev and (#prev > #now or (#prev == #now and prev >= now)) then
				redis.call('SET', KEYS[3], prev, 'PX', ARGV[5])
				redis.call('INCR', KEYS[3])
				fence = redis.call('GET', KEYS[3])
			end
			redis.call('SET', KEYS[1], head .. ' ' .. fence .. ' ' .. owner, 'PX', ttl)
			message = 'granted ' .. head .. ' ' .. fence
			break
		end
	end
end
if message == 'released' and ARGV[3] == 'a' then
	return code
end
local ok, err = pcall(redis.call, 'SPUBLISH', channel, message)
if not ok then
	local ok2 = pcall(redis.call, 'PUBLISH', channel, message)
	if not ok2 then
		if type(err) == 'table' then err = err.err end
		return {1, tostring(err)}
	end
end
return 1
