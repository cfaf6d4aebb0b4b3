package httpx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// BenchmarkGuard compares one POST handler with and without httpx.Guard on
// the real Redis, in one run at one concurrency (RunParallel with 8
// goroutines per core): over loopback HTTP (client and server in this
// process) and called in process with a recorder. "guarded" uses a new key
// per request (claim + complete); "replay" repeats one key.
//
//	go test -run XXX -bench Guard -benchmem ./httpx
func BenchmarkGuard(b *testing.B) {
	e := newEnv(b, guard.Options{})
	payload := []byte(`{"id":"ord_1","status":"created","amount":1000,"currency":"EUR"}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(payload)
	})
	guarded := httpx.Guard(e.g, httpx.Options{Logger: quiet, SingleCaller: true})(handler)
	body := `{"sku":"tea","qty":1}`
	var seq atomic.Int64
	keyFor := func(sameKey bool) string {
		if sameKey {
			return "the-same-key"
		}
		return "k" + strconv.FormatInt(seq.Add(1), 36)
	}
	cases := []struct {
		name    string
		h       http.Handler
		sameKey bool
	}{
		{"plain", handler, false},
		{"guarded", guarded, false},
		{"replay", guarded, true},
	}
	for _, bc := range cases {
		b.Run("http/"+bc.name, func(b *testing.B) {
			srv := httptest.NewServer(bc.h)
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 256}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", keyFor(bc.sameKey))
					resp, err := c.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
		b.Run("inproc/"+bc.name, func(b *testing.B) {
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", keyFor(bc.sameKey))
					rec := httptest.NewRecorder()
					bc.h.ServeHTTP(rec, req)
					if rec.Code != http.StatusCreated {
						b.Errorf("status %d", rec.Code)
						return
					}
				}
			})
		})
	}
}
