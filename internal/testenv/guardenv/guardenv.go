// Package guardenv gives tests a guard.RedisStore and a guard.Guard on the
// real Redis that internal/testenv names (apart from testenv so that
// guard's own in-package tests can use testenv without an import cycle).
package guardenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Store returns a RedisStore on the standalone Redis, under a prefix of its
// own (opts.Prefix is replaced by testenv.Prefix(t) unless set), with its scripts
// loaded.
func Store(t testing.TB, opts guard.RedisOptions) *guard.RedisStore {
	t.Helper()
	return StoreOn(t, testenv.Redis(t), opts)
}

// StoreOn is Store on the client c: a Cluster, a client with a hook that
// counts commands, a server the test started. The test owns c.
func StoreOn(t testing.TB, c redis.UniversalClient, opts guard.RedisOptions) *guard.RedisStore {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testenv.Prefix(t)
	}
	s := guard.NewRedisStore(c, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("load scripts: %v", err)
	}
	return s
}

// Guard returns a Guard over Store(t, guard.RedisOptions{}).
func Guard(t testing.TB, opts guard.Options) *guard.Guard {
	t.Helper()
	return guard.New(Store(t, guard.RedisOptions{}), opts)
}
