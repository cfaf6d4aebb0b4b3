package httpcore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// resultPanics is a binding's Response whose Result panics, as a
// framework's response reader might.
type resultPanics struct{}

func (resultPanics) Result() Result                             { panic("result") }
func (resultPanics) Send()                                      {}
func (resultPanics) Abandon() (w http.ResponseWriter, cut bool) { return httptest.NewRecorder(), false }

// A panic after the handler returned but before the write that ends the
// claim (here the binding's Result): nobody holds the claim any more, so
// its lease runs out, as an abandoned claim's does, instead of being
// extended for as long as the process lives.
func TestFinishPanicStopsHeartbeat(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := guardenv.Store(t, guard.RedisOptions{})
	m := New(guard.New(store, guard.Options{Lease: lease}), Config{SingleCaller: true})
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "finish-panics")
	req := NetRequest{r}
	b := m.Begin(httptest.NewRecorder(), req)
	if !b.Run {
		t.Fatalf("Begin = %+v, want Run", b)
	}
	func() {
		defer func() {
			if p := recover(); p != "result" {
				t.Fatalf("recovered %v, want the Result's panic", p)
			}
		}()
		m.RunBuffered(req, b, resultPanics{}, func(context.Context) {})
	}()
	if b.Held.Context().Err() == nil {
		t.Error("the handler's context outlived the panic")
	}
	other := guard.New(store, guard.Options{Lease: lease})
	testenv.WaitFor(t, 20*lease, "the abandoned claim's lease to run out", func() bool {
		out, err := other.Claim(context.Background(), b.Held.Lease().Key, b.Fingerprint)
		if err != nil {
			return false
		}
		_ = other.Release(context.Background(), out.Lease)
		return true
	})
}
