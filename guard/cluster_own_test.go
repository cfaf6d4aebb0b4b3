package guard_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
)

// ownCluster is a Redis Cluster of the test's own, for tests that move its
// slots: masters (and replicas) started by testenv.StartRedis, joined by
// redis-cli --cluster create.
type ownCluster struct {
	t       testing.TB
	masters []*testenv.Server
	nodes   []*testenv.Server
	ids     map[string]string // addr -> node id
	cls     map[*testenv.Server]*redis.Client
}

func (rc *ownCluster) cl(s *testenv.Server) *redis.Client {
	if c, ok := rc.cls[s]; ok {
		return c
	}
	c := s.Client()
	rc.cls[s] = c
	return c
}

func startOwnCluster(t testing.TB, masters, replicasPer int) *ownCluster {
	t.Helper()
	rc := &ownCluster{t: t, ids: map[string]string{}, cls: map[*testenv.Server]*redis.Client{}}
	n := masters * (1 + replicasPer)
	var addrs []string
	for range n {
		s := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "3000", "--cluster-port", strconv.Itoa(testenv.FreePort(t)), "--cluster-require-full-coverage", "no")
		rc.nodes = append(rc.nodes, s)
		addrs = append(addrs, s.Addr())
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli, which makes the Cluster, is not installed (it comes with redis-server): %v", err)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPer), "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	testenv.WaitFor(t, 30*time.Second, "cluster ok", func() bool {
		for _, s := range rc.nodes {
			c := rc.cl(s)
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			shards, err := c.ClusterShards(ctx).Result()
			if err != nil || len(shards) != masters {
				return false
			}
			for _, sh := range shards {
				if len(sh.Nodes) != 1+replicasPer {
					return false
				}
			}
		}
		return true
	})
	for _, s := range rc.nodes {
		id, err := rc.cl(s).ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		rc.ids[s.Addr()] = id
	}
	for _, s := range rc.nodes {
		role, _ := rc.cl(s).Do(ctx, "role").Slice()
		if len(role) > 0 && role[0] == "master" {
			rc.masters = append(rc.masters, s)
		}
	}
	return rc
}

func (rc *ownCluster) addrs() []string {
	var a []string
	for _, s := range rc.nodes {
		a = append(a, s.Addr())
	}
	return a
}

func (rc *ownCluster) client(opts *redis.ClusterOptions) *redis.ClusterClient {
	if opts == nil {
		opts = &redis.ClusterOptions{}
	}
	opts.Addrs = rc.addrs()
	c := redis.NewClusterClient(opts)
	rc.t.Cleanup(func() { _ = c.Close() })
	return c
}

// owner returns the master that serves slot now (by asking every master).
func (rc *ownCluster) owner(slot int) *testenv.Server {
	ctx := context.Background()
	for _, s := range rc.nodes {
		shards, err := rc.cl(s).ClusterShards(ctx).Result()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			for _, sl := range sh.Slots {
				if slot < int(sl.Start) || slot > int(sl.End) {
					continue
				}
				for _, n := range sh.Nodes {
					for _, m := range rc.nodes {
						if n.Role == "master" && m.Port() == int(n.Port) {
							return m
						}
					}
				}
			}
		}
		break
	}
	rc.t.Fatalf("no owner of slot %d", slot)
	return nil
}

// beginMove puts slot in migration from src to dst.
func (rc *ownCluster) beginMove(slot int, src, dst *testenv.Server) {
	ctx := context.Background()
	if err := rc.cl(dst).Do(ctx, "cluster", "setslot", slot, "importing", rc.ids[src.Addr()]).Err(); err != nil {
		rc.t.Fatalf("importing: %v", err)
	}
	// Refused until gossip has told src of dst.
	testenv.WaitFor(rc.t, 5*time.Second, "slot migrating from "+src.Addr(), func() bool {
		return rc.cl(src).Do(ctx, "cluster", "setslot", slot, "migrating", rc.ids[dst.Addr()]).Err() == nil
	})
}

// moveKeys migrates up to n keys of slot from src to dst; it returns how
// many it moved.
func (rc *ownCluster) moveKeys(slot int, src, dst *testenv.Server, n int) int {
	ctx := context.Background()
	keys, err := rc.cl(src).ClusterGetKeysInSlot(ctx, slot, n).Result()
	if err != nil {
		rc.t.Fatalf("getkeysinslot: %v", err)
	}
	if len(keys) == 0 {
		return 0
	}
	args := []any{"migrate", "127.0.0.1", dst.Port(), "", 0, 5000, "replace", "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := rc.cl(src).Do(ctx, args...).Err(); err != nil && err != redis.Nil {
		rc.t.Fatalf("migrate: %v", err)
	}
	return len(keys)
}

// endMove gives slot to dst on every master.
func (rc *ownCluster) endMove(slot int, src, dst *testenv.Server) {
	ctx := context.Background()
	id := rc.ids[dst.Addr()]
	for _, s := range []*testenv.Server{dst, src} {
		if err := rc.cl(s).Do(ctx, "cluster", "setslot", slot, "node", id).Err(); err != nil {
			rc.t.Fatalf("setslot node: %v", err)
		}
	}
	for _, s := range rc.masters {
		if s == dst || s == src {
			continue
		}
		_ = rc.cl(s).Do(ctx, "cluster", "setslot", slot, "node", id).Err()
	}
}
