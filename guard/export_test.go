package guard

import "github.com/redis/go-redis/v9"

// Client returns the store's client, for tests of this package that write
// to Redis behind the store's back (corrupt records, vanished keys). It is
// not part of the API: callers of NewRedisStore hold their client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }
