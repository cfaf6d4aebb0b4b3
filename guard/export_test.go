package guard

import "github.com/redis/go-redis/v9"

// Client returns the store's client, for tests of this package that write
// to Redis behind the store's back (corrupt records, vanished keys). It is
// not part of the API: callers of NewRedisStore hold their client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// Busy counts one more call under way on the store until the returned
// func is called, as a concurrent call does: past DirectCalls of them,
// the store's next single call goes through the client's autopipeliner.
func (s *RedisStore) Busy() func() {
	s.inflight.Add(1)
	return func() { s.inflight.Add(-1) }
}
