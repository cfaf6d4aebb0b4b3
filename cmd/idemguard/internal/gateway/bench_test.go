package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/bench"
	"github.com/idemguard/idemguard/internal/testenv"
)

// benchWorkers is how many requests every row has in flight at once.
const benchWorkers = 16

// benchReplayKeys is how many completed keys the replay rows cycle over.
const benchReplayKeys = 1000

// BenchmarkGateway compares a POST sent through the gateway to an upstream
// with the same POST sent straight to that upstream: the same client, the
// same upstream, the same concurrency (benchWorkers), in the same run.
//
//   - direct-fresh / gateway-fresh: a new Idempotency-Key each request;
//     through the gateway that is a claim, a forward-step write, the
//     forward and the write of the stored answer.
//   - direct-replay / gateway-replay: one of benchReplayKeys keys the
//     gateway completed beforehand; the upstream runs the request again,
//     the gateway answers from Redis and never reaches it.
//
// upstream-reqs/op counts what reached the upstream: 1 for the fresh and
// direct rows, 0 for gateway-replay (the row fails otherwise). ×direct is
// a gateway row's throughput over its direct row's, measured just before
// it; load1 is the machine's load average over the last minute when the
// row ended (the ratios mean little on a busy machine). With -v the
// load averages before and after are logged too:
//
//	go test -run '^$' -bench Gateway -benchtime 3s ./cmd/idemguard/internal/gateway
func BenchmarkGateway(b *testing.B) {
	var upstreamReqs atomic.Int64
	result := bytes.Repeat([]byte("a"), 64)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		upstreamReqs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%q}`, result)
	}))
	defer up.Close()

	prefix := testenv.Prefix(b)
	text := strings.NewReplacer("{redis}", testenv.RedisAddr(b), "{prefix}", prefix, "{upstream}", up.URL).Replace(`
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}", pool_size: 64}
log: {level: error}
defaults:
  caller: {header: X-Account-Id}
  ttl: 2m
routes:
  - pattern: POST /orders
`)
	cfg, err := Parse("bench.yaml", []byte(text))
	if err != nil {
		b.Fatal(err)
	}
	gw, err := New(cfg, Options{Logger: testenv.Logger(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(gw.Handler())
	defer front.Close()

	tr := &http.Transport{MaxIdleConns: 2 * benchWorkers, MaxIdleConnsPerHost: benchWorkers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := []byte(`{"item":"book","quantity":1}`)
	post := func(url, key string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Account-Id", "acme")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusCreated {
			err = fmt.Errorf("POST %s: %s", url, resp.Status)
		}
		return resp, err
	}

	// The replay rows' keys, completed through the gateway.
	run := strings.ToLower(strconv.FormatInt(time.Now().UnixNano(), 36))
	replayKey := func(i int64) string { return "replay-" + run + "-" + strconv.FormatInt(i%benchReplayKeys, 10) }
	for i := range int64(benchReplayKeys) {
		if _, err := post(front.URL+"/orders", replayKey(i)); err != nil {
			b.Fatal(err)
		}
	}

	var fresh atomic.Int64
	perOp := map[string]time.Duration{}
	row := func(name, base string, replay bool) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism((benchWorkers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			url := base + "/orders"
			var next atomic.Int64
			before := upstreamReqs.Load()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := "fresh-" + run + "-" + strconv.FormatInt(fresh.Add(1), 10)
					if replay {
						key = replayKey(next.Add(1))
					}
					resp, err := post(url, key)
					if err != nil {
						b.Error(err)
						return
					}
					if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (replay && base == front.URL) {
						b.Errorf("%s: Idempotent-Replayed %v", name, replayed)
						return
					}
				}
			})
			b.StopTimer()
			reached := upstreamReqs.Load() - before
			b.ReportMetric(float64(reached)/float64(b.N), "upstream-reqs/op")
			if replay && base == front.URL && reached != 0 {
				b.Fatalf("%d replays served by the gateway reached the upstream", reached)
			}
			perOp[name] = b.Elapsed() / time.Duration(b.N)
			if direct, ok := strings.CutPrefix(name, "gateway-"); ok && perOp["direct-"+direct] > 0 {
				b.ReportMetric(float64(perOp["direct-"+direct])/float64(perOp[name]), "×direct")
			}
			b.ReportMetric(load1(), "load1")
		})
	}
	load := bench.LoadAverage()
	row("direct-fresh", up.URL, false)
	row("gateway-fresh", front.URL, false)
	row("direct-replay", up.URL, true)
	row("gateway-replay", front.URL, true)
	ratio := func(g, d string) string {
		if perOp[g] == 0 || perOp[d] == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f× the throughput of %s (%s vs %s per request)",
			float64(perOp[d])/float64(perOp[g]), d, perOp[g].Round(time.Microsecond), perOp[d].Round(time.Microsecond))
	}
	b.Logf("%d workers, GOMAXPROCS %d, Redis %s; load average (1, 5, 15 min) %s before, %s after", benchWorkers,
		runtime.GOMAXPROCS(0), cfg.Redis.Addrs[0], load, bench.LoadAverage())
	b.Logf("gateway-fresh: %s", ratio("gateway-fresh", "direct-fresh"))
	b.Logf("gateway-replay: %s", ratio("gateway-replay", "direct-replay"))
}

// load1 is the load average over the last minute, or -1.
func load1() float64 {
	f, err := strconv.ParseFloat(strings.Fields(bench.LoadAverage() + " ")[0], 64)
	if err != nil {
		return -1
	}
	return f
}
