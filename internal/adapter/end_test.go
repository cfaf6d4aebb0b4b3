package adapter

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestEndWithinBudgetStoreGone: a store that went away while the handler
// ran holds the response for the settle budget (and the last release's
// second), not for as many whole tries as fit in it: each try is cut off
// when the budget ends.
func TestEndWithinBudgetStoreGone(t *testing.T) {
	for _, end := range []struct {
		name string
		fn   func(*Ender, *guard.Held)
	}{
		{"complete", func(e *Ender, h *guard.Held) { e.Complete(h, []byte("done"), "path", "/x") }},
		{"release", func(e *Ender, h *guard.Held) { e.Release(h) }},
	} {
		t.Run(end.name, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			g := guard.New(guard.NewRedisStore(srv.Client(), guard.RedisOptions{}), guard.Options{Lease: 30 * time.Second})
			e := &Ender{Logger: testenv.Logger(t), Prefix: "test: "}
			out, held, err := g.Hold(context.Background(), guard.Key{Scope: "end", ID: end.name}, "fp")
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("hold: %v %v", out.Status, err)
			}
			srv.Kill()
			start := time.Now()
			end.fn(e, held)
			// SettleBudget for the write, a second for Complete's last
			// release, and slack for a loaded machine.
			if took, limit := time.Since(start), SettleBudget+time.Second+700*time.Millisecond; took > limit {
				t.Fatalf("%s with the store gone took %v; want at most %v", end.name, took, limit)
			}
		})
	}
}
