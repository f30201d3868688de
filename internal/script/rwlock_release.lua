-- rwlock_release: delete a read-write lock's lease (the writer's, or a
-- reader's and its entry in the readers' index) only if this token holds
-- it, take the token's intent out if it was a waiting writer's, and retire
-- the token, as release.lua does for a lock.
--
-- KEYS[1]  the lease's key    the writer, or this reader
-- KEYS[2]  token marker
-- KEYS[3]  the readers' index
-- KEYS[4]  the waiting writers' intents
-- KEYS[5]  the writer
-- ARGV[1]  token
-- ARGV[2]  wake-up channel: lock:{name}:rw, plus the database number on a
--          database other than 0
-- ARGV[3]  'r' to release a lease, 'a' to abandon an Acquire that gave up
-- ARGV[4]  how long the marker is kept, milliseconds
--
-- "released" is published when the waiters may now enter: the writer
-- left (readers, and writers, may), the last reader left (a writer may),
-- or a waiting writer gave up (readers may).
--
-- Returns release.lua's replies: 1, 0 or -1, or {1, error} when the lease
-- was deleted but the wake-up could not be published.

local held = redis.call('GET', KEYS[1])
local code, deleted = unlock(KEYS[1], KEYS[2], ARGV[1])
retire(KEYS[2], code, deleted, ARGV[3] ~= 'r', ARGV[4])

local wake = redis.call('ZREM', KEYS[4], ARGV[1]) == 1
if deleted and KEYS[1] == KEYS[5] then
	wake = true
elseif deleted then
	redis.call('ZREM', KEYS[3], held)
	local nowMs = millis(clock())
	wake = wake or live(KEYS[3], nowMs) == 0
end
if not wake then
	return code
end
local published = publish(ARGV[2], 'released')
if code == 1 then
	return published
end
return code
