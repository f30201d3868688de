-- inspect: read a lock without changing anything.
--
-- KEYS[1]  lock key, whose value is "<token> <fence> <owner>"
-- KEYS[2]  fence counter
--
-- Returns {value, pttl, counter}: the lock's value ("" when it is not
-- held), its PTTL (-2 when it is not held, -1 without expiry) and the
-- counter ("" when there is none), read in one atomic step.

return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
