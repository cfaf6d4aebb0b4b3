package httpx_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestTimeoutHandlerOutsideGuard: the README's rule for http.TimeoutHandler.
// Outside the Guard, its 503 leaves the key pending while the handler
// runs on, and the retry gets the handler's own answer, replayed: one
// run. Inside, its 503 is the answer the Guard sees, which releases the
// key while the handler still runs, so every retry starts another run
// beside the first: the layout the README warns against.
func TestTimeoutHandlerOutsideGuard(t *testing.T) {
	for _, outside := range []bool{true, false} {
		name := map[bool]string{true: "outside", false: "inside"}[outside]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			entered, release := make(chan struct{}, 8), make(chan struct{})
			closeRelease := sync.OnceFunc(func() { close(release) })
			t.Cleanup(closeRelease) // before the server closes
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{} // the charge goes out
				<-release             // its answer comes after the timeout
				w.WriteHeader(http.StatusCreated)
			})
			idem := httpx.Guard(e.g, httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)})
			// Outside, the timeout must come after the claim (a claim the
			// timeout's cancellation meets first is released unrun): a
			// quarter of a second is hundreds of claims.
			var hh http.Handler
			if outside {
				hh = http.TimeoutHandler(idem(h), 250*time.Millisecond, "timed out")
			} else {
				hh = idem(http.TimeoutHandler(h, 250*time.Millisecond, "timed out"))
			}
			srv, c := serve(t, hh)
			if r := do(t, c, "POST", srv.URL+"/pay", "x", key("to-1")...); r.status != http.StatusServiceUnavailable {
				t.Fatalf("first: %d %q, want the timeout's 503", r.status, r.body)
			}
			<-entered
			r := do(t, c, "POST", srv.URL+"/pay", "x", key("to-1")...)
			if !outside {
				<-entered // the retry ran the handler again, beside the first
				if r.status != http.StatusServiceUnavailable {
					t.Fatalf("retry: %d %q", r.status, r.body)
				}
				return
			}
			if r.status != http.StatusServiceUnavailable && r.status != http.StatusConflict {
				t.Fatalf("retry while the handler runs: %d %q", r.status, r.body)
			}
			closeRelease()
			// The retrying client asks again until the handler's answer is stored.
			retry := httpx.NewClient(httpx.TransportOptions{InFlightDelay: 20 * time.Millisecond, BaseDelay: 10 * time.Millisecond})
			defer retry.CloseIdleConnections()
			got, err := send(context.Background(), retry, "POST", srv.URL+"/pay", "x", key("to-1")...)
			if err != nil {
				t.Fatal(err)
			}
			if got.status != http.StatusCreated || !got.replayed() {
				t.Fatalf("after the handler answered: %d replayed %v %q", got.status, got.replayed(), got.body)
			}
			select {
			case <-entered:
				t.Fatal("the handler ran twice")
			default:
			}
		})
	}
}
