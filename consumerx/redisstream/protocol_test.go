package redisstream

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// protocol is a client of the Redis the tests use, by how it is set up.
type protocol struct {
	name   string
	client func() redis.UniversalClient
}

// protocols returns clients speaking RESP3 (go-redis v9's default) and
// RESP2 (Protocol: 2), to a standalone Redis and to a Cluster (keys then
// need one hash tag).
func protocols(t *testing.T) []protocol {
	addr, cluster := testenv.RedisAddr(t), testenv.List(t, testenv.EnvCluster)
	return []protocol{
		{"standalone RESP3", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr, Protocol: 3}) }},
		{"standalone RESP2", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr, Protocol: 2}) }},
		{"cluster RESP3", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster, Protocol: 3})
		}},
		{"cluster RESP2", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster, Protocol: 2})
		}},
	}
}

// autoClaim reads XAUTOCLAIM's reply itself (go-redis's XAutoClaim drops
// the deleted ids): the reply parses alike whether the user's client
// speaks RESP3 (go-redis v9's default) or RESP2 (Protocol: 2), on a
// standalone Redis and on a Cluster. No bug: pins it.
func TestAutoClaimDeletedUnderRESP2AndRESP3(t *testing.T) {
	e := newEnv(t, guard.Options{})
	for _, tc := range protocols(t) {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.client()
			t.Cleanup(func() { _ = rdb.Close() })
			ctx := context.Background()
			stream := "{" + e.prefix + "}" + testenv.Prefix(t) + "orders"
			for i := 1; i <= 3; i++ {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 3}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.XTrimMinID(ctx, stream, "1-3").Err(); err != nil {
				t.Fatal(err)
			}
			c, err := New(rdb, e.g, func(context.Context, consumerx.Message) error { return nil },
				Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var (
				msgs []redis.XMessage
				del  []string
			)
			testenv.WaitFor(t, 5*time.Second, "xautoclaim to take the entry left (idle 1ms)", func() bool {
				_, m, d, err := c.autoClaim(ctx, "0-0")
				if err != nil {
					t.Fatal(err)
				}
				msgs, del = append(msgs, m...), append(del, d...) // Redis 7 names a deleted one once
				return len(msgs) > 0
			})
			slices.Sort(del)
			if len(msgs) != 1 || msgs[0].ID != "1-3" || msgs[0].Values["payload"] != "charge 3" || !slices.Equal(del, []string{"1-1", "1-2"}) {
				t.Fatalf("xautoclaim: entries %v, deleted %v; want 1-3 (charge 3), deleted [1-1 1-2]", msgs, del)
			}
		})
	}
}
