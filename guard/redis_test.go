package guard_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
)

// miniStore returns a RedisStore on a fresh miniredis and the server, so a
// test can move its clock.
func miniStore(t *testing.T) (*guard.RedisStore, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := guard.NewRedisStore(c, guard.RedisOptions{})
	if err := s.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, mr
}

func TestContractMiniredis(t *testing.T) {
	var mr *miniredis.Miniredis
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			var s *guard.RedisStore
			s, mr = miniStore(t)
			return s
		},
		Advance: func(t *testing.T, d time.Duration) { mr.FastForward(d + time.Millisecond) },
		Keys:    300, // miniredis recompiles each script per call: keep the race proportionate
	})
}

func TestContractRedis(t *testing.T) { runContract(t, testenv.Redis(t), guard.RedisOptions{}) }

func TestContractRedisCluster(t *testing.T) {
	runContract(t, testenv.Cluster(t), guard.RedisOptions{})
}

// runContract runs the contract over a real server on stores with options
// o, each test under a key prefix of its own.
func runContract(t *testing.T, c redis.UniversalClient, o guard.RedisOptions) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			opts := o
			opts.Prefix = testenv.Prefix(t)
			s := guard.NewRedisStore(c, opts)
			if err := s.LoadScripts(context.Background()); err != nil {
				t.Fatal(err)
			}
			return s
		},
		Advance: storetest.Wait,
	})
}
