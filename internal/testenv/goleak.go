package testenv

import "go.uber.org/goleak"

// ClientGoroutines tells goleak to pass over the goroutines a live go-redis
// client owns: its autopipeliner's flusher, which a guard.RedisStore starts
// on its first pipelined call and the client's Close stops. A test that
// checks for leaks while its client is still open passes it to VerifyNone.
var ClientGoroutines = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9.(*apShard).flusher")
