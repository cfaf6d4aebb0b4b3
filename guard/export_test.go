package guard

import "github.com/redis/go-redis/v9"

// Client returns the store's client, for tests of this package that write
// to Redis behind the store's back (corrupt records, vanished keys). It is
// not part of the API: callers of NewRedisStore hold their client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// Busy counts one more call under way on the store until the returned
// func is called, so that the store's next pipeline goes through the
// client's autopipeliner (exec's shared path), as beside a concurrent
// call.
func (s *RedisStore) Busy() func() {
	s.inflight.Add(1)
	return func() { s.inflight.Add(-1) }
}
