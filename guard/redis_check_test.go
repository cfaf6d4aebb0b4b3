package guard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// evicting lists every maxmemory-policy but noeviction: each of them
// evicts keys with a TTL, as every record has.
var evicting = []string{"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// warnings is a slog handler that keeps the records it is given.
type warnings struct{ buf bytes.Buffer }

func (w *warnings) logger() *slog.Logger { return slog.New(slog.NewTextHandler(&w.buf, nil)) }
func (w *warnings) count() int           { return strings.Count(w.buf.String(), "level=WARN") }

func TestCheckEvictionPolicy(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	s := guard.NewRedisStore(srv.Client(), guard.RedisOptions{})
	if err := s.Check(bg, guard.CheckOptions{}); err != nil {
		t.Fatalf("Check on noeviction (the default) = %v", err)
	}
	for _, policy := range evicting {
		if err := admin.ConfigSet(bg, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Check(bg, guard.CheckOptions{})
		var ev *guard.EvictionError
		if !errors.Is(err, guard.ErrEviction) || !errors.As(err, &ev) || ev.Policy != policy || ev.Addr != srv.Addr() ||
			!strings.Contains(err.Error(), "maxmemory-policy "+policy) || !strings.Contains(err.Error(), "noeviction") {
			t.Errorf("Check with %s = %v; want an *EvictionError naming the server, the setting and noeviction", policy, err)
		}
		var w warnings
		if err := s.Check(bg, guard.CheckOptions{AcceptEviction: true, Logger: w.logger()}); err != nil || w.count() != 1 ||
			!strings.Contains(w.buf.String(), policy) {
			t.Errorf("Check with %s accepted = %v, log %q; want nil and one warning naming it", policy, err, w.buf.String())
		}
	}
}

// Where CONFIG is renamed away (as managed services do), the policy is
// read from INFO memory.
func TestCheckWithoutConfigCommand(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", "")
	s := guard.NewRedisStore(srv.Client(), guard.RedisOptions{})
	if err := srv.Client().ConfigGet(bg, "maxmemory-policy").Err(); err == nil {
		t.Fatal("CONFIG still answers: the test proves nothing")
	}
	var ev *guard.EvictionError
	if err := s.Check(bg, guard.CheckOptions{}); !errors.As(err, &ev) || ev.Policy != "volatile-lru" {
		t.Fatalf("Check = %v, want volatile-lru read from INFO", err)
	}
	ok := testenv.StartRedis(t, "--rename-command", "CONFIG", "")
	if err := guard.NewRedisStore(ok.Client(), guard.RedisOptions{}).Check(bg, guard.CheckOptions{}); err != nil {
		t.Fatalf("Check on noeviction without CONFIG = %v", err)
	}
}

func TestCheckUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1})
	defer c.Close()
	if err := guard.NewRedisStore(c, guard.RedisOptions{}).Check(bg, guard.CheckOptions{}); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Check of a dead server = %v, want ErrUnavailable", err)
	}
}

// On a Cluster, every master is checked: a bad policy on any one of them
// is refused, and accepting it logs one warning.
func TestCheckClusterEveryMaster(t *testing.T) {
	nodes := startCluster(t, 3)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	s := guard.NewRedisStore(cc, guard.RedisOptions{})
	if err := s.Check(bg, guard.CheckOptions{}); err != nil {
		t.Fatalf("Check on a noeviction cluster = %v", err)
	}
	for i, bad := range nodes {
		admin := bad.Client()
		if err := admin.ConfigSet(bg, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
		var ev *guard.EvictionError
		if err := s.Check(bg, guard.CheckOptions{}); !errors.As(err, &ev) || ev.Addr != bad.Addr() || ev.Policy != "allkeys-lru" {
			t.Errorf("master %d (%s) evicts: Check = %v, want it named", i, bad.Addr(), err)
		}
		var w warnings
		if err := s.Check(bg, guard.CheckOptions{AcceptEviction: true, Logger: w.logger()}); err != nil || w.count() != 1 {
			t.Errorf("accepted: %v, %d warnings; want one", err, w.count())
		}
		if err := admin.ConfigSet(bg, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Two masters evict: one warning names both.
	for _, n := range nodes[:2] {
		if err := n.Client().ConfigSet(bg, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
			t.Fatal(err)
		}
	}
	var w warnings
	if err := s.Check(bg, guard.CheckOptions{AcceptEviction: true, Logger: w.logger()}); err != nil || w.count() != 1 ||
		!strings.Contains(w.buf.String(), nodes[0].Addr()) || !strings.Contains(w.buf.String(), nodes[1].Addr()) {
		t.Errorf("two masters accepted: %v, log %q; want one warning naming both", err, w.buf.String())
	}
}

// startCluster starts n redis-servers of the test's own as a Cluster of n
// masters and waits until it serves every slot.
func startCluster(t *testing.T, n int) []*testenv.Server {
	t.Helper()
	nodes := make([]*testenv.Server, n)
	bus := make([]int, n)
	for i := range nodes {
		// The bus port too below the ephemeral range (by default it is
		// port+10000, where a client connection may hold it).
		bus[i] = testenv.FreePort(t)
		nodes[i] = testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(bus[i]))
	}
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	const slots = 16384
	for i, node := range nodes {
		c := node.Client()
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("addslots on %s: %v", node.Addr(), err)
		}
		if i > 0 {
			if err := c.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", nodes[0].Port(), bus[0]).Err(); err != nil {
				t.Fatalf("meet: %v", err)
			}
		}
	}
	for _, node := range nodes {
		c := node.Client()
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("cluster did not form: %v %s", err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling the cluster bus's gossip: there is no event to wait on
		}
	}
	return nodes
}

// A noeviction server out of memory refuses writes with OOM: the guard
// reports it as ErrUnavailable (retry later), runs nothing, and works
// again once memory is freed.
func TestOOMIsUnavailable(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	admin := srv.Client()
	s := guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{})
	if err := s.Check(bg, guard.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	g := guard.New(s, guard.Options{})
	var n int
	fn := func(context.Context, guard.Lease) ([]byte, error) { n++; return []byte("v"), nil }
	if _, err := g.Do(bg, guard.Key{Scope: "s", ID: "before"}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	fillMemory(t, admin)
	_, err := g.Do(bg, guard.Key{Scope: "s", ID: "oom"}, "fp", fn)
	if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Do on an OOM server = %v, want ErrUnavailable wrapping the OOM reply", err)
	}
	if n != 1 {
		t.Fatalf("the effect ran on an OOM server")
	}
	// A replay needs no memory.
	if res, err := g.Do(bg, guard.Key{Scope: "s", ID: "before"}, "fp", fn); err != nil || !res.Replayed {
		t.Fatalf("replay on an OOM server = %+v, %v", res, err)
	}
	if err := admin.ConfigSet(bg, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Do(bg, guard.Key{Scope: "s", ID: "oom"}, "fp", fn); err != nil || n != 2 {
		t.Fatalf("after memory was freed: %v (ran %d)", err, n)
	}
}

// A holder whose effect ran while the server filled up still ends its
// claim: completes, failures, releases and steps are written on a server
// out of memory (their scripts carry allow-oom), and its lease extended
// (PEXPIRE is not refused), where new claims are
// refused. Without that the key stayed pending and its effect ran again
// once the lease ran out. Through Do, Hold and DoBatch (a pipeline of
// scripts).
func TestOOMHolderStillEnds(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	admin := srv.Client()
	s := guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{})
	g := guard.New(s, guard.Options{})
	fill := func() { t.Helper(); fillMemory(t, admin) }
	free := func() {
		t.Helper()
		if err := admin.ConfigSet(bg, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := func(id string) guard.Key { return guard.Key{Scope: "oom", ID: id} }
	state := func(id string) guard.State {
		t.Helper()
		rec, err := g.Get(bg, key(id))
		if errors.Is(err, guard.ErrNotFound) {
			return 0
		}
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return rec.State
	}

	// Do: a step, then the result, both recorded on the full server.
	res, err := g.Do(bg, key("do"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		fill()
		if _, err := guard.Step(ctx, l, "charge", func(context.Context) ([]byte, error) { return []byte("ch_1"), nil }); err != nil {
			return nil, err
		}
		return []byte("done"), nil
	})
	if err != nil || string(res.Value) != "done" {
		t.Fatalf("Do whose effect ran while memory filled = %q, %v; want its result stored", res.Value, err)
	}
	if st := state("do"); st != guard.StateCompleted {
		t.Fatalf("record after Do = %v, want completed", st)
	}
	if _, err := g.Do(bg, key("new"), "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("an effect ran on a full server")
		return nil, nil
	}); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("a new claim on the full server = %v, want ErrUnavailable", err)
	}
	free()

	// Held: a failure and a release.
	_, failed, err := g.Hold(bg, key("fail"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	_, released, err := g.Hold(bg, key("release"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	fill()
	// Extend's PEXPIRE is taken as it is (it needs no flag line).
	if err := g.Extend(bg, failed.Lease()); err != nil {
		t.Fatalf("Extend on the full server: %v", err)
	}
	if err := failed.Fail(errors.New("declined")); err != nil {
		t.Fatalf("Fail on the full server: %v", err)
	}
	if err := released.Release(); err != nil {
		t.Fatalf("Release on the full server: %v", err)
	}
	if st := state("fail"); st != guard.StateFailed {
		t.Fatalf("record after Fail = %v, want failed", st)
	}
	if st := state("release"); st != 0 {
		t.Fatalf("record after Release = %v, want none", st)
	}
	free()

	// DoBatch: the completions go in one pipeline of scripts.
	items := []guard.BatchItem{{Key: key("b0"), Fingerprint: "fp"}, {Key: key("b1"), Fingerprint: "fp"}}
	out := g.DoBatch(bg, items, func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
		if i == 0 {
			fill()
		}
		return []byte("ok"), nil
	}, guard.BatchOptions{})
	for i, r := range out {
		if r.Err != nil {
			t.Fatalf("batch item %d whose effect ran while memory filled: %v", i, r.Err)
		}
	}
	for _, id := range []string{"b0", "b1"} {
		if st := state(id); st != guard.StateCompleted {
			t.Fatalf("record %s after DoBatch = %v, want completed", id, st)
		}
	}
	free()
}

// A server whose last background save failed refuses writes with
// MISCONF (stop-writes-on-bgsave-error) until a save succeeds: a passing
// state, as NOREPLICAS is. A key already done is still replayed, and a new
// key is ErrUnavailable (a 503), not a plain error (a 500).
func TestMisconfStillReplays(t *testing.T) {
	// Saves are on, into a directory the test removes: the next
	// background save fails at once.
	dir := t.TempDir()
	srv := testenv.StartRedis(t, "--save", "3600 1", "--dir", dir)
	admin := srv.Client()
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{})
	done := guard.Key{Scope: "s", ID: "done"}
	var ran atomic.Int32
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran.Add(1); return []byte("v"), nil }
	if _, err := g.Do(bg, done, "fp", fn); err != nil {
		t.Fatal(err)
	}
	failBackgroundSave(t, admin, dir)
	if err := admin.Set(bg, "small", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "MISCONF") {
		t.Fatalf("a write after the failed save = %v, want MISCONF", err)
	}
	if res, err := g.Do(bg, done, "fp", fn); err != nil || !res.Replayed || string(res.Value) != "v" {
		t.Errorf("replay on a server refusing writes = %+v, %v; want the stored result", res, err)
	}
	if _, err := g.Do(bg, guard.Key{Scope: "s", ID: "new"}, "fp", fn); !errors.Is(err, guard.ErrUnavailable) ||
		!strings.Contains(err.Error(), "MISCONF") {
		t.Errorf("Do of a new key on a server refusing writes = %v, want ErrUnavailable wrapping MISCONF", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the effect ran %d times, want 1", n)
	}
}

// failBackgroundSave removes the directory the server saves into, then
// starts a background save, which fails as on a full or lost disk.
func failBackgroundSave(t *testing.T, admin *redis.Client, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := admin.BgSave(bg).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the save to be reported failed", func() bool {
		text, err := admin.Info(bg, "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(text, "rdb_last_bgsave_status:err")
	})
}

// fillMemory sets maxmemory below what the server already uses: every
// write that needs memory is then refused with OOM (noeviction).
func fillMemory(t *testing.T, admin *redis.Client) {
	t.Helper()
	used, err := usedMemory(admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(bg, "maxmemory", strconv.FormatInt(used/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(bg, "small", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write on the full server = %v, want OOM", err)
	}
}

// A primary without the replicas min-replicas-to-write asks for refuses
// every SET, even one that would write nothing, as a server out of memory
// does: a key already done is still replayed (the claim script reads
// first), through Do and DoBatch, and a new key is ErrUnavailable. (Its
// replay was refused too, a 503 for a request whose response was stored.)
func TestNoReplicasStillReplays(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{})
	done := guard.Key{Scope: "s", ID: "done"}
	var ran atomic.Int32
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran.Add(1); return []byte("v"), nil }
	if _, err := g.Do(bg, done, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(bg, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := g.Do(bg, done, "fp", fn); err != nil || !res.Replayed || string(res.Value) != "v" {
		t.Errorf("replay on a primary without its replicas = %+v, %v; want the stored result", res, err)
	}
	if _, err := g.Do(bg, guard.Key{Scope: "s", ID: "new-single"}, "fp", fn); !errors.Is(err, guard.ErrUnavailable) ||
		!strings.Contains(err.Error(), "NOREPLICAS") {
		t.Errorf("Do of a new key on a primary without its replicas = %v, want ErrUnavailable wrapping NOREPLICAS", err)
	}
	out := g.DoBatch(bg, []guard.BatchItem{{Key: done, Fingerprint: "fp"}, {Key: guard.Key{Scope: "s", ID: "new"}, Fingerprint: "fp"}},
		func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) { return fn(ctx, l) }, guard.BatchOptions{})
	if r := out[0]; r.Err != nil || !r.Replayed || string(r.Value) != "v" {
		t.Errorf("batch replay on a primary without its replicas = %+v; want the stored result", r)
	}
	if r := out[1]; !errors.Is(r.Err, guard.ErrUnavailable) {
		t.Errorf("batch claim of a new key on a primary without its replicas = %+v; want ErrUnavailable", r)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the effect ran %d times, want 1", n)
	}
}

func usedMemory(c *redis.Client) (int64, error) {
	info, err := c.Info(bg, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no used_memory in INFO memory")
}
