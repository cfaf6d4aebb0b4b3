package guard_test

import (
	"context"
	"crypto/rand"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/scripts"
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
		Advance:     func(t *testing.T, d time.Duration) { mr.FastForward(d + time.Millisecond) },
		Keys:        300, // miniredis recompiles each script per call: keep the race proportionate
		Corruptions: redisCorruptions,
	})
}

func TestContractRedis(t *testing.T) { runContract(t, testenv.Redis(t), guard.RedisOptions{}) }

func TestContractRedisCluster(t *testing.T) {
	runContract(t, testenv.Cluster(t), guard.RedisOptions{})
}

// runContract runs the contract over a real server on stores with options
// o, each test under a key prefix of its own, in parallel with the other
// parallel tests: the contract mostly waits for leases and retention to
// run out, and its cases that need a call answered within a span run
// again with a longer lease when a loaded machine was late (storetest's
// onTime).
func runContract(t *testing.T, c redis.UniversalClient, o guard.RedisOptions) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			return guardenv.StoreOn(t, c, o)
		},
		Advance:     storetest.Wait,
		Parallel:    true,
		Corruptions: redisCorruptions,
	})
}

// cmdstat is one command's line of INFO commandstats.
type cmdstat struct {
	calls int
	usec  int
}

// commandStats reads INFO commandstats: calls and microseconds per
// command, counting the commands scripts run inside Redis too.
func commandStats(t *testing.T, c *redis.Client) map[string]cmdstat {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]cmdstat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var s cmdstat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				s.calls, _ = strconv.Atoi(v)
			case "usec":
				s.usec, _ = strconv.Atoi(v)
			}
		}
		m[strings.TrimPrefix(name, "cmdstat_")] = s
	}
	return m
}

// delta is after − before, commands that did not run left out, and the
// stats commands themselves.
func delta(before, after map[string]cmdstat) map[string]cmdstat {
	d := map[string]cmdstat{}
	for name, a := range after {
		b := before[name]
		if name == "info" || name == "config|resetstat" || a.calls == b.calls {
			continue
		}
		d[name] = cmdstat{calls: a.calls - b.calls, usec: a.usec - b.usec}
	}
	return d
}

func calls(d map[string]cmdstat) map[string]int {
	m := map[string]int{}
	for k, v := range d {
		m[k] = v.calls
	}
	return m
}

func usec(d map[string]cmdstat, top ...string) (all int) {
	for _, v := range d {
		all += v.usec
	}
	return all
}

// TestRoundTrips counts what Redis executes for the guard: a fresh key is
// one native SET NX GET and one complete script (which reads and writes
// the record: GET, SET inside), a replay is one SET NX GET and nothing
// else, and the client sends nothing more.
func TestRoundTrips(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client()
	s := guardenv.StoreOn(t, c, guard.RedisOptions{})
	var sent atomic.Int64
	c.AddHook(countHook{&sent})
	g := guard.New(s, guard.Options{})
	admin := srv.Client()
	if err := admin.ConfigResetStat(bg).Err(); err != nil {
		t.Fatal(err)
	}
	result := strings.Repeat("r", 200)
	const n = 200
	var effects atomic.Int64
	before := commandStats(t, admin)
	sent.Store(0)
	for i := range n {
		if _, err := g.Do(bg, guard.Key{Scope: "tenant-42/POST /orders", ID: strconv.Itoa(i)}, "fp", count(&effects, result)); err != nil {
			t.Fatal(err)
		}
	}
	fresh := delta(before, commandStats(t, admin))
	freshSent := sent.Swap(0)
	for i := range n {
		if res, err := g.Do(bg, guard.Key{Scope: "tenant-42/POST /orders", ID: strconv.Itoa(i)}, "fp", count(&effects, "x")); err != nil || !res.Replayed {
			t.Fatal(res, err)
		}
	}
	replays := delta(before, commandStats(t, admin))
	for name, d := range fresh {
		r := replays[name]
		r.calls -= d.calls
		r.usec -= d.usec
		replays[name] = r
		if r.calls == 0 {
			delete(replays, name)
		}
	}
	replaySent := sent.Load()

	// Top-level: SET (the claim) and EVALSHA (complete); inside the
	// script: GET and SET. Two commands inside Redis per fresh key beyond
	// the two it is sent.
	if want := map[string]int{"set": 2 * n, "evalsha": n, "get": n}; !maps.Equal(calls(fresh), want) {
		t.Fatalf("fresh keys: commands %v, want %v", calls(fresh), want)
	}
	if freshSent != 2*n {
		t.Fatalf("client sent %d commands for %d fresh keys, want %d", freshSent, n, 2*n)
	}
	if want := map[string]int{"set": n}; !maps.Equal(calls(replays), want) {
		t.Fatalf("replays: commands %v, want %v", calls(replays), want)
	}
	if replaySent != n {
		t.Fatalf("client sent %d commands for %d replays, want %d", replaySent, n, n)
	}
	// Redis's own time per operation (commandstats usec, which counts a
	// script's inner commands inside its EVALSHA too): for the record,
	// not asserted, since a loaded machine stretches it.
	t.Logf("redis command time: %.2fµs per fresh key (EVALSHA %.2fµs), %.2fµs per replay",
		float64(fresh["set"].usec/2+fresh["evalsha"].usec)/n, float64(fresh["evalsha"].usec)/n, float64(usec(replays))/n)
}

// countHook counts the commands a client sends.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestCompleteFastPath: a lease that knows the pending record its claim
// left completes with a value the client built; it is the value the
// script builds for a lease that does not (one built by hand), for a
// first attempt, a recovered one and one after a failure.
func TestCompleteFastPath(t *testing.T) {
	s, mr := miniStore(t)
	c := s.Client()
	ttl := time.Hour
	req := func(id, tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: id}, Token: tok, Fingerprint: strings.Repeat("f", 64), Lease: time.Second, TTL: ttl}
	}
	claim := func(r guard.ClaimRequest) guard.Lease {
		t.Helper()
		out, err := s.Claim(bg, r)
		if err != nil || out.Status != guard.Acquired {
			t.Fatal(out, err)
		}
		return out.Lease
	}
	value := func(id string) string {
		return c.Get(bg, s.Name(guard.Key{Scope: "s", ID: id})).Val()
	}
	for _, shape := range []string{"first", "recovered", "after-failure"} {
		var leases [2]guard.Lease
		for i, id := range []string{shape + "-known", shape + "-by-hand"} {
			tok := "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
			switch shape {
			case "first":
				leases[i] = claim(req(id, tok))
			case "recovered":
				claim(req(id, "OTHER"))
				mr.FastForward(2 * time.Second)
				leases[i] = claim(req(id, tok))
			case "after-failure":
				l := claim(req(id, "OTHER"))
				if err := s.Fail(bg, l, "boom", ttl); err != nil {
					t.Fatal(err)
				}
				leases[i] = claim(req(id, tok))
			}
		}
		known, byHand := leases[0], guard.Lease{Key: leases[1].Key, Token: leases[1].Token}
		for _, l := range []guard.Lease{known, byHand} {
			if err := s.Complete(bg, l, []byte("the result"), ttl); err != nil {
				t.Fatalf("%s: %v", shape, err)
			}
			if err := s.Complete(bg, l, []byte("the result"), ttl); err != nil {
				t.Fatalf("%s: complete again: %v", shape, err)
			}
		}
		a, b := value(shape+"-known"), value(shape+"-by-hand")
		if a != b || a == "" {
			t.Errorf("%s: completed from the known pending record %q, by the script %q", shape, a, b)
		}
		rec, err := s.Get(bg, known.Key)
		if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "the result" || rec.Fence != known.Fence ||
			rec.Attempt != known.Attempt || rec.Recovered != known.Recovered {
			t.Errorf("%s: %+v, %v; lease %+v", shape, rec, err, known)
		}
	}
}

// The scripts that must run on a server out of memory carry a flag line
// (allow-oom) that Redis 7 reads and miniredis cannot compile: on
// miniredis the store sends them plain from the first refusal on, whether
// LoadScripts or a call met it, and Scripts names what it sends, so a
// health check finds them all loaded.
func TestScriptsPlainWhereFlagsRefused(t *testing.T) {
	loaded := func(t *testing.T, c *redis.Client, s *guard.RedisStore) {
		t.Helper()
		var hashes []string
		for _, sc := range s.Scripts() {
			hashes = append(hashes, sc.Hash())
		}
		found, err := c.ScriptExists(context.Background(), hashes...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range found {
			if !f {
				t.Errorf("script %d of Scripts() is not in the server's cache", i)
			}
		}
	}
	t.Run("miniredis/LoadScripts", func(t *testing.T) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		s := guard.NewRedisStore(c, guard.RedisOptions{})
		if err := s.LoadScripts(context.Background()); err != nil {
			t.Fatalf("LoadScripts on miniredis: %v", err)
		}
		if slices.Equal(s.Scripts(), scripts.All()) {
			t.Fatal("Scripts() names the flagged scripts miniredis refused")
		}
		loaded(t, c, s)
	})
	t.Run("miniredis/call", func(t *testing.T) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		g := guard.New(guard.NewRedisStore(c, guard.RedisOptions{}), guard.Options{})
		for range 2 { // the first Complete meets the refusal, the second goes plain at once
			key := guard.Key{Scope: "s", ID: rand.Text()}
			if _, err := g.Do(context.Background(), key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				return []byte("v"), nil
			}); err != nil {
				t.Fatalf("Do on miniredis without LoadScripts: %v", err)
			}
			if rec, err := g.Get(context.Background(), key); err != nil || rec.State != guard.StateCompleted {
				t.Fatalf("record = %+v, %v; want completed", rec, err)
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		c := testenv.Redis(t)
		s := guardenv.StoreOn(t, c, guard.RedisOptions{})
		if err := s.LoadScripts(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Scripts(), scripts.All()) {
			t.Fatal("Scripts() on Redis 7 is not the flagged scripts")
		}
		loaded(t, c, s)
	})
}
