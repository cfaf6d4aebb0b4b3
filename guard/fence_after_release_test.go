package guard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestFenceGrowsAfterRelease: a released first attempt reads as absent,
// but its holder ran (an httpx handler that answered 503 after its
// downstream write, an effect that panicked), and a write of its may
// still be on its way: the next acquisition's fence is above its own, so
// a downstream check on Lease.Fence refuses the released holder's late
// write (docs/design.md, rule 4).
func TestFenceGrowsAfterRelease(t *testing.T) {
	g := guard.New(guardenv.Store(t, guard.RedisOptions{}), guard.Options{Lease: 10 * time.Second})

	var fences []int64
	fail := true
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, _, _ := httpx.ClaimFrom(r.Context())
		fences = append(fences, lease.Fence) // the downstream write, with its fence
		if fail {
			fail = false
			w.WriteHeader(http.StatusServiceUnavailable) // released: retry with the same key
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httpx.Guard(g, httpx.Options{SingleCaller: true})(h)
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "fence-after-release-"+t.Name())
		srv.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(fences) != 2 || fences[1] <= fences[0] {
		t.Errorf("httpx: fences of the released attempt and of the retry %v, want the retry's above", fences)
	}

	key := guard.Key{Scope: "fence-after-release", ID: t.Name()}
	var doFences []int64
	func() {
		defer func() { _ = recover() }()
		_, _ = g.Do(context.Background(), key, "fp", func(_ context.Context, l guard.Lease) ([]byte, error) {
			doFences = append(doFences, l.Fence)
			panic("boom after the downstream write")
		})
	}()
	if _, err := g.Do(context.Background(), key, "fp", func(_ context.Context, l guard.Lease) ([]byte, error) {
		doFences = append(doFences, l.Fence)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(doFences) != 2 || doFences[1] <= doFences[0] {
		t.Errorf("Do: fences of the panicked attempt and of the retry %v, want the retry's above", doFences)
	}
	if rec, err := g.Get(context.Background(), key); err != nil || rec.Attempt != 1 || rec.Fence != doFences[1] {
		t.Errorf("record after the retry = %+v, %v; want attempt 1 (a release counts none), fence %d", rec, err, doFences[1])
	}
}
