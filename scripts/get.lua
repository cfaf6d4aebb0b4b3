-- get: the record, its lease and its remaining retention, in one round trip.
-- KEYS[1] record, KEYS[2] lease
-- Returns {fields (flat name/value list), lease ms left, record ms left}.
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[1])}
