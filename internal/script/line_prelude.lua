-- line_prelude: a line of fair waiters, after prelude.lua's functions: a
-- sorted set of tokens by arrival (queue) and their entries (a hash).

-- drop takes id out of a line (a sorted set of ids) and its entries.
local function drop(queue, entries, id)
	redis.call('ZREM', queue, id)
	redis.call('HDEL', entries, id)
end

-- firstLive returns the line's first live entry, its id and value, or nil,
-- dropping the dead ones before it. An entry lives while its value's
-- leading number, its expiry in ms, is at least nowMs.
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

-- keepEntry writes token's entry, "<expiry> <rest>", living entryTTL ms
-- from nowMs, and makes the line and its entries live as long.
local function keepEntry(queue, entries, token, nowMs, entryTTL, rest)
	redis.call('HSET', entries, token, (nowMs + tonumber(entryTTL)) .. ' ' .. rest)
	redis.call('PEXPIRE', queue, entryTTL)
	redis.call('PEXPIRE', entries, entryTTL)
end

-- join puts a fair waiter at the end of a line, by now, unless it is in it
-- already, and keeps its entry.
local function join(queue, entries, token, now, nowMs, entryTTL, rest)
	if not redis.call('ZSCORE', queue, token) then
		redis.call('ZADD', queue, now, token)
	end
	keepEntry(queue, entries, token, nowMs, entryTTL, rest)
end

-- outOfLine answers the keep-alive ('k') or the departure ('d', mode) of a
-- fair waiter granted nothing: for 'd', it takes the waiter out of line and
-- returns {0}; for 'k', {3} when it is out of line (its entry expired, or a
-- release dropped it: it joins again), nil when it is in it.
local function outOfLine(queue, entries, token, mode)
	if mode == 'd' then
		drop(queue, entries, token)
		return {0}
	end
	if not redis.call('ZSCORE', queue, token) then
		return {3}
	end
end

-- whenFree answers the keep-alive of a fair waiter in line that finds the
-- lock (or a permit) free, its holder's lease expired: {4} when it is the
-- first live waiter (it takes the lock), {3} when no entry lives (it joins
-- again), {0, -2} when a waiter ahead takes it.
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
