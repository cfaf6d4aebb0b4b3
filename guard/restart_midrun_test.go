package guard_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestRestartMidRun: holders claimed before Redis is killed and
// restarted from its append-only file (fsync always), with the script
// cache lost, complete, fail, release, extend and record steps after the
// restart (NOSCRIPT answered with EVAL), pipelined and not, single and
// batched; completed keys replay, with no effect run twice and no key
// left pending. A SCRIPT FLUSH in the middle changes nothing either.
func TestRestartMidRun(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts guard.RedisOptions
	}{
		{"pipelined", guard.RedisOptions{DirectCalls: -1}},
		{"unpipelined", guard.RedisOptions{Unpipelined: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 8})
			t.Cleanup(func() { _ = c.Close() })
			opts := mode.opts
			opts.Prefix = "rc:"
			s := guard.NewRedisStore(c, opts)
			if err := s.LoadScripts(ctx); err != nil {
				t.Fatal(err)
			}
			g := guard.New(s, guard.Options{Lease: 30 * time.Second, TTL: time.Hour})
			const n = 24
			key := func(i int) guard.Key { return guard.Key{Scope: "restart", ID: fmt.Sprint(i)} }
			var effects [n]atomic.Int32
			leases := make([]guard.Lease, n)
			for i := range n {
				out, err := s.Claim(ctx, guard.ClaimRequest{Key: key(i), Token: fmt.Sprintf("tok-%02d", i), Fingerprint: "fp", Lease: 30 * time.Second, TTL: time.Hour})
				if err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim %d: %+v, %v", i, out, err)
				}
				leases[i] = out.Lease
				effects[i].Add(1)
			}
			if err := s.SaveStep(ctx, leases[0], 0, guard.StepResult{Name: "a", Result: []byte("1")}); err != nil {
				t.Fatal(err)
			}
			srv.Kill()
			srv.Restart()
			// Ends of the claims made before the restart, by one call each and
			// by batches, pipelined when the mode says so.
			var wg sync.WaitGroup
			for i := range n / 2 {
				wg.Go(func() {
					var err error
					switch i % 4 {
					case 0:
						err = s.Complete(ctx, leases[i], []byte("done"), time.Hour)
					case 1:
						if err = s.Extend(ctx, leases[i], time.Minute); err == nil {
							err = s.Complete(ctx, leases[i], []byte("done"), time.Hour)
						}
					case 2:
						err = s.Fail(ctx, leases[i], "boom", time.Hour)
					case 3:
						if err = s.SaveStep(ctx, leases[i], 0, guard.StepResult{Name: "a", Result: []byte("x")}); err == nil {
							err = s.Complete(ctx, leases[i], []byte("done"), time.Hour)
						}
					}
					if err != nil {
						t.Errorf("key %d after the restart: %v", i, err)
					}
				})
			}
			wg.Wait()
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			var ws []guard.Write
			for i := n / 2; i < n; i++ {
				kind := guard.WriteComplete
				if i%3 == 0 {
					kind = guard.WriteRelease
				}
				ws = append(ws, guard.Write{Kind: kind, Lease: leases[i], Result: []byte("done"), TTL: time.Hour})
			}
			for i, err := range s.WriteBatch(ctx, ws) {
				if err != nil {
					t.Errorf("batch write %d: %v", i, err)
				}
			}
			srv.Kill()
			srv.Restart()
			// Every key now: completed ones replay, failed and released ones
			// run once more, nothing is pending.
			for i := range n {
				wg.Go(func() {
					res, err := g.Do(ctx, key(i), "fp", func(context.Context, guard.Lease) ([]byte, error) {
						effects[i].Add(1)
						return []byte("done"), nil
					})
					if err != nil || string(res.Value) != "done" {
						t.Errorf("key %d: %+v, %v", i, res, err)
					}
				})
			}
			wg.Wait()
			for i := range n {
				want := int32(1)
				if (i < n/2 && i%4 == 2) || (i >= n/2 && i%3 == 0) {
					want = 2 // failed or released: run again
				}
				if got := effects[i].Load(); got != want {
					t.Errorf("key %d: %d effects, want %d", i, got, want)
				}
				rec, err := s.Get(ctx, key(i))
				if err != nil || rec.State != guard.StateCompleted {
					t.Errorf("key %d at the end: %+v, %v", i, rec, err)
				}
			}
		})
	}
}
