package httpx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// benchWorkers is the concurrency of BenchmarkGuard: that of `idemguard
// bench` (its http, http-replay and http-plain rows).
const benchWorkers = 64

// BenchmarkGuard compares one POST handler with and without httpx.Guard on
// the real Redis, in one run at one concurrency (64 goroutines, as
// `idemguard bench`), routed by a ServeMux pattern as an application
// would: over loopback HTTP (client and server in this process) and
// called in process with a recorder. "plain" is the handler alone,
// "guarded" uses a new key per request (claim + complete), "replay"
// repeats one completed key. Besides ns/op (which follows the machine's
// load) it reports cpu-µs/op, the process's CPU time (user + system, all
// goroutines: client, server and Redis client) per request, and allocs/op:
// compare those across the three.
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
	plain := http.NewServeMux()
	plain.Handle("POST /orders", handler)
	guarded := http.NewServeMux()
	guarded.Handle("POST /orders", httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(b), SingleCaller: true})(handler))
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
		{"plain", plain, false},
		{"guarded", guarded, false},
		{"replay", guarded, true},
	}
	parallel := max(1, benchWorkers/runtime.GOMAXPROCS(0))
	for _, bc := range cases {
		b.Run("http/"+bc.name, func(b *testing.B) {
			srv := httptest.NewServer(bc.h)
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 256}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			post := func() error {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", keyFor(bc.sameKey))
				resp, err := c.Do(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Errorf("status %d", resp.StatusCode)
				}
				return nil
			}
			if bc.sameKey {
				if err := post(); err != nil { // completes the key
					b.Fatal(err)
				}
			}
			b.SetParallelism(parallel)
			b.ReportAllocs()
			cpu := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := post(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		})
		b.Run("inproc/"+bc.name, func(b *testing.B) {
			send := func() {
				req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", keyFor(bc.sameKey))
				rec := httptest.NewRecorder()
				bc.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Errorf("status %d", rec.Code)
				}
			}
			send()
			b.SetParallelism(parallel)
			b.ReportAllocs()
			cpu := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					send()
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU returns the CPU time (user + system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
