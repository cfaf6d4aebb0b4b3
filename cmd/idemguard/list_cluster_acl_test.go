package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestListClusterWithoutInfo: an operator account that may not run INFO
// (INFO is in @dangerous: a least-privilege "+@all -@dangerous" user) on a
// Cluster node: list finds the Cluster (CLUSTER INFO) and scans every
// master. It took the node for a standalone server and listed one master's
// records only, exit 0 (found by review).
func TestListClusterWithoutInfo(t *testing.T) {
	cluster := testenv.Cluster(t)
	prefix := testenv.Prefix(t)
	store := guardenv.StoreOn(t, cluster, guard.RedisOptions{Prefix: prefix})
	g := guard.New(store, guard.Options{Lease: time.Minute})
	ctx := context.Background()
	const n = 24
	for i := range n {
		if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: strconv.Itoa(i)}, "fp"); err != nil {
			t.Fatal(err)
		}
		name := store.Name(guard.Key{Scope: "s", ID: strconv.Itoa(i)})
		t.Cleanup(func() { _ = cluster.Del(context.Background(), name).Err() })
	}
	const user, pw = "noinfo", "noinfo-pw"
	nodes := testenv.List(t, testenv.EnvCluster)
	for _, a := range nodes {
		c := redis.NewClient(&redis.Options{Addr: a})
		if err := c.Do(ctx, "ACL", "SETUSER", user, "reset", "on", ">"+pw, "~*", "&*", "+@all", "-info").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Do(context.Background(), "ACL", "DELUSER", user).Err()
			_ = c.Close()
		})
	}
	url := fmt.Sprintf("redis://%s:%s@%s", user, pw, nodes[0])
	code, out, stderr := cli(t, "list", "--redis", url, "--prefix", prefix)
	if code != 0 || !strings.Contains(stderr, fmt.Sprintf("%d pending keys", n)) {
		t.Errorf("list on a Cluster node as a user without INFO: exit %d, %q (want %d pending keys)\n%s", code, stderr, n, out)
	}
}

// TestListStandaloneWithoutInfo: a standalone server whose INFO is
// renamed away is told from a Cluster's node by CLUSTER INFO ("cluster
// support disabled", or no such command) and listed; a user allowed
// neither (NOPERM) is refused with an error saying which to allow, not
// guessed standalone.
func TestListStandaloneWithoutInfo(t *testing.T) {
	for _, renamed := range [][]string{{"INFO"}, {"INFO", "CLUSTER"}} {
		var args []string
		for _, c := range renamed {
			args = append(args, "--rename-command", c, "")
		}
		srv := testenv.StartRedis(t, args...)
		g := guard.New(guard.NewRedisStore(srv.Client(), guard.RedisOptions{}), guard.Options{})
		completeKeys(t, g, 3)
		code, out, stderr := cli(t, "list", "--redis", srv.Addr(), "--state", "completed")
		if code != 0 || strings.Count(out, " completed ") != 3 {
			t.Fatalf("list on a server without %v: exit %d, %d rows, %s", renamed, code, strings.Count(out, " completed "), stderr)
		}
	}

	srv := testenv.StartRedis(t)
	if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "neither", "on", ">pw", "~*", "&*", "+@all", "-info", "-cluster").Err(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := cli(t, "list", "--redis", fmt.Sprintf("redis://neither:pw@%s", srv.Addr()))
	wantError(t, code, stderr, 1, "allow one of them")
}
