package httpx_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// unreachable wraps a real store; its next Complete calls fail as they do
// while Redis is restarting (go-redis answers with its last dial error).
type unreachable struct {
	guard.Store
	failCompletes atomic.Int64
}

func (u *unreachable) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if u.failCompletes.Add(-1) >= 0 {
		return fmt.Errorf("%w: dial tcp: connection refused (injected)", guard.ErrUnavailable)
	}
	return u.Store.Complete(ctx, lease, result, ttl)
}

// TestCompleteRetried: a completion that fails because the store cannot be
// reached is retried on the spot, and stored once the store answers; if it
// never does within the budget, the key is released rather than left
// pending for a lease, so the next request is not told 409.
func TestCompleteRetried(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int64
	}{{"store back", 3}, {"store gone", 1 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			u := &unreachable{Store: e.store}
			u.failCompletes.Store(tc.fails)
			g := guard.New(u, guard.Options{})
			h := &orders{}
			srv, c := serve(t, httpx.Guard(g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(h))
			start := time.Now()
			first := do(t, c, "POST", srv.URL+"/o", "a", key("cr-1")...)
			took := time.Since(start)
			if first.status != http.StatusCreated || first.replayed() {
				t.Fatalf("first: %d", first.status)
			}
			if took > 5*time.Second {
				t.Fatalf("the first answer took %s", took)
			}
			rec, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "cr-1"})
			second := do(t, c, "POST", srv.URL+"/o", "a", key("cr-1")...)
			if tc.fails < 100 {
				if err != nil || rec.State != guard.StateCompleted || !second.replayed() || h.runs.Load() != 1 {
					t.Fatalf("record %+v, %v; second replayed %v; runs %d", rec, err, second.replayed(), h.runs.Load())
				}
				return
			}
			if !errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("record %+v, %v; want released", rec, err)
			}
			if second.status != http.StatusCreated || second.replayed() {
				t.Fatalf("second: %d replayed %v; want a run at once, not 409", second.status, second.replayed())
			}
			t.Logf("the first answer took %s with the store gone", took)
		})
	}
}
