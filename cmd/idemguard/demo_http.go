package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/wait"
	"github.com/idemguard/idemguard/inventory"
)

// The demo's HTTP storm: copies of each request sent at once through
// httpx.Guard, every answer checked against its key's first.
type httpStats struct {
	requests, attempts, executions, replays, conflicts int64
	effects, distinct, mismatched                      int64
}

func httpStorm(ctx context.Context, c demoConfig, g *guard.Guard, bs *backstop.Backstop, effects *demoEffects, logger *slog.Logger, prog *progress) (httpStats, error) {
	var st httpStats
	var attempts, executions, replays, conflicts, seq atomic.Int64
	var effectErr atomic.Value
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		key := r.Header.Get(httpx.DefaultHeader)
		// The handler stops when its context ends: httpx.Guard ends it
		// when the lease is lost, before another request can take the key
		// (docs/design.md, section 4), and the order must not be placed
		// then. The key is released (a 5xx is not stored) and the client
		// asks again.
		notPlaced := func() {
			http.Error(w, "the order was not placed: "+context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
		}
		if !wait.For(r.Context(), c.work) {
			notPlaced()
			return
		}
		body := fmt.Appendf(nil, `{"order":%q,"customer":%q,"number":%d}`, key, r.Context().Value(customerKey{}), seq.Add(1))
		w.Header().Set("Content-Type", "application/json")
		if bs == nil {
			if err := effects.record(r.Context(), effects.db, "http", key); err != nil {
				if r.Context().Err() != nil {
					notPlaced()
					return
				}
				effectErr.Store(err)
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
			return
		}
		// The order and the response the client gets, in one transaction.
		tx, err := effects.db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		if err := effects.record(r.Context(), tx, "http", key); err != nil {
			if r.Context().Err() != nil {
				notPlaced()
				return
			}
			effectErr.Store(err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = httpx.CommitResponse(w, r, tx, bs, http.StatusCreated, body) // it answers in every outcome
	})
	mux := inventory.NewServeMux(inventory.New(inventory.Options{}), nil)
	demoRoutes(mux, g, c, logger, orders, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			attempts.Add(1)
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			switch {
			case sw.status == http.StatusConflict:
				conflicts.Add(1)
			case sw.Header().Get(httpx.ReplayedHeader) == "true":
				replays.Add(1)
			}
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return st, fmt.Errorf("http: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/orders"

	base := &http.Transport{MaxIdleConns: c.clients, MaxIdleConnsPerHost: c.clients}
	defer base.CloseIdleConnections()
	client := httpx.NewClient(httpx.TransportOptions{Base: base, MaxAttempts: 100}) // bounded by the timeout below
	client.Timeout = 50 * time.Second

	// Copies of a key are next to each other in the queue, so they are in
	// flight together.
	answers := make([][]string, c.keys)
	for k := range answers {
		answers[k] = make([]string, c.copies)
	}
	jobs := make(chan [2]int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				k, cp := j[0], j[1]
				key := "order-" + effects.run + "-" + strconv.Itoa(k)
				// Each copy has a token of its own (a client that refreshed
				// it between retries): the customer, not the token, scopes
				// the key.
				token := "cust-" + strconv.Itoa(k%5) + "." + strconv.Itoa(cp)
				body, err := post(ctx, client, url, key, token)
				if err != nil {
					select {
					case errs <- fmt.Errorf("http: POST %s: %w", key, err):
					default:
					}
					continue
				}
				answers[k][cp] = body
				prog.add(1)
			}
		}()
	}
feed:
	for k := range c.keys {
		for cp := range c.copies {
			select {
			case jobs <- [2]int{k, cp}:
			case err := <-errs:
				errs <- err
				break feed
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return st, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if v := effectErr.Load(); v != nil {
		return st, fmt.Errorf("http: business effect: %w", v.(error))
	}
	for _, copies := range answers {
		for _, b := range copies[1:] {
			if b != copies[0] {
				st.mismatched++
			}
		}
	}
	st.requests = int64(c.keys * c.copies)
	st.attempts, st.executions, st.replays, st.conflicts = attempts.Load(), executions.Load(), replays.Load(), conflicts.Load()
	st.effects, st.distinct, err = effects.count(ctx, "http")
	return st, err
}

// demoRoutes registers the demo service's routes: POST /orders, seen
// first by observe, then authenticated, then behind httpx.Guard with keys
// kept per customer. `idemguard inventory` lists the same routes.
func demoRoutes(mux *inventory.ServeMux, g *guard.Guard, c demoConfig, logger *slog.Logger, orders http.Handler, observe func(http.Handler) http.Handler) {
	mux.Handle("POST /orders", orders, observe, authenticateCustomer,
		httpx.Guard(g, httpx.Options{Logger: logger, Wait: c.wait, Tenant: httpx.TenantFromContext[string](customerKey{}, nil)}))
}

func post(ctx context.Context, client *http.Client, url, key, token string) (string, error) {
	body := []byte(`{"item":"book","key":"` + key + `"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set(httpx.DefaultHeader, key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return string(b), nil
}

// customerKey is where authenticateCustomer stores the customer.
type customerKey struct{}

// authenticateCustomer stands in for an authentication middleware: a
// bearer token "<customer>.<anything>" names its customer (a real one
// verifies the token). The customer goes into the request context, where
// httpx.TenantFromContext reads it.
func authenticateCustomer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		customer, _, found := strings.Cut(token, ".")
		if !ok || !found || customer == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), customerKey{}, customer)))
	})
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
