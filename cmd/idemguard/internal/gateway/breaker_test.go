package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestBreakerAnswersRetryAfter: while Redis is out (fallback fail-closed)
// the client gets 503 with Retry-After, nothing forwarded: with the breaker
// open, and while its half-open probe is under way (the probe itself and
// the claims waiting for its verdict).
func TestBreakerAnswersRetryAfter(t *testing.T) {
	srv := testenv.StartRedis(t)
	u := newUpstream(t)
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["`+srv.Addr()+`"], prefix: "{prefix}"}
fallback: {policy: fail-closed, timeout: 300ms, failures_to_open: 1, open_timeout: 2s}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`, u.URL)
	check := func(what string, r reply) {
		t.Helper()
		ra, err := strconv.Atoi(r.header.Get("Retry-After"))
		t.Logf("%s: %d Retry-After %q %s", what, r.status, r.header.Get("Retry-After"), r.body)
		if r.status != http.StatusServiceUnavailable || err != nil || ra < 1 {
			t.Errorf("%s: %d, Retry-After %q: want 503 with Retry-After", what, r.status, r.header.Get("Retry-After"))
		}
	}
	if r := post(t, e.srv.URL+"/orders", "k-b1", `{"order":"b1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
		t.Fatalf("before the outage: %d %q", r.status, r.body)
	}
	srv.Kill()
	check("Redis down, the breaker closed", post(t, e.srv.URL+"/orders", "k-b2", `{"order":"b2"}`, "X-Account-Id", "acme"))
	if s := e.gw.fb.State(); s != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", s)
	}
	check("the breaker open", post(t, e.srv.URL+"/orders", "k-b3", `{"order":"b3"}`, "X-Account-Id", "acme"))
	srv.Restart()
	// Redis answers nothing for 4 s: the probe's claim times out.
	sleeper := srv.Client()
	pinger := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer pinger.Close()
	slept := make(chan error, 1)
	go func() { slept <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", "4").Err() }()
	testenv.WaitFor(t, 10*time.Second, "Redis to sleep", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return pinger.Ping(ctx).Err() != nil
	})
	testenv.WaitFor(t, 10*time.Second, "the breaker to turn half-open", func() bool { return e.gw.fb.State() == fallback.StateHalfOpen })
	var wg sync.WaitGroup
	replies := make([]reply, 4)
	for i := range replies {
		wg.Go(func() {
			replies[i] = post(t, e.srv.URL+"/orders", "k-p"+strconv.Itoa(i), `{"order":"p`+strconv.Itoa(i)+`"}`, "X-Account-Id", "acme")
		})
	}
	wg.Wait()
	for i, r := range replies {
		check("half-open, request "+strconv.Itoa(i), r)
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"b2", "b3", "p0", "p1", "p2", "p3"} {
		if n := u.count(o); n != 0 {
			t.Errorf("%s reached the upstream %d times while Redis was out", o, n)
		}
	}
}

// TestBreakerRetryAfterUntilProbe: the 503 of a request the open breaker
// kept from Redis says, in Retry-After, when the breaker lets a probe
// through (open_timeout after it opened, rounded up), not 1 s: a client
// that follows a Retry-After of 1 meets the same open breaker again.
func TestBreakerRetryAfterUntilProbe(t *testing.T) {
	srv := testenv.StartRedis(t)
	u := newUpstream(t)
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["`+srv.Addr()+`"], prefix: "{prefix}"}
fallback: {policy: fail-closed, timeout: 300ms, failures_to_open: 1, open_timeout: 5s}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`, u.URL)
	srv.Kill()
	opening := time.Now() // the breaker opens after this
	post(t, e.srv.URL+"/orders", "k-r1", `{"order":"r1"}`, "X-Account-Id", "acme")
	if s := e.gw.fb.State(); s != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", s)
	}
	r := post(t, e.srv.URL+"/orders", "k-r2", `{"order":"r2"}`, "X-Account-Id", "acme")
	answered := time.Now()
	left := opening.Add(5 * time.Second).Sub(answered) // at least this long until a probe
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	t.Logf("503 %gs after the breaker opened at the latest: Retry-After %q", answered.Sub(opening).Seconds(), r.header.Get("Retry-After"))
	if r.status != http.StatusServiceUnavailable || err != nil {
		t.Fatalf("breaker open: %d, Retry-After %q; want 503 with Retry-After", r.status, r.header.Get("Retry-After"))
	}
	if time.Duration(ra)*time.Second < left || ra > 5 {
		t.Errorf("breaker open: Retry-After %d; the breaker lets no probe through for %v more (open_timeout 5s): want %d to 5",
			ra, left, int((left+time.Second-1)/time.Second))
	}
	if n := u.count("r2"); n != 0 {
		t.Errorf("r2 reached the upstream %d times while Redis was out", n)
	}
}

// TestNotForwardedRetryAfterUntilProbe: a request claimed before Redis
// went away whose upstream then cannot be reached is not forwarded (503
// not-forwarded, key released); if the breaker opened meanwhile, its
// retry meets the open breaker, so its Retry-After says when the breaker
// lets a probe through.
func TestNotForwardedRetryAfterUntilProbe(t *testing.T) {
	srv := testenv.StartRedis(t)
	u := newUpstream(t)
	dialing := make(chan struct{})
	fail := make(chan struct{})
	var once sync.Once
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		once.Do(func() { close(dialing) })
		select {
		case <-fail:
			return nil, errors.New("test: upstream unreachable")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["`+srv.Addr()+`"], prefix: "{prefix}"}
fallback: {policy: fail-closed, timeout: 300ms, failures_to_open: 1, open_timeout: 5s}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`, u.URL, func(o *Options) { o.dial = dial })
	replies := make(chan reply, 1)
	go func() { replies <- post(t, e.srv.URL+"/orders", "k-n1", `{"order":"n1"}`, "X-Account-Id", "acme") }()
	<-dialing // n1 is claimed and dialling the upstream
	srv.Kill()
	opening := time.Now()
	if r := post(t, e.srv.URL+"/orders", "k-n2", `{"order":"n2"}`, "X-Account-Id", "acme"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("n2 with Redis down: %d %s", r.status, r.body)
	}
	if s := e.gw.fb.State(); s != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", s)
	}
	close(fail)
	r := <-replies
	left := time.Until(opening.Add(5 * time.Second))
	t.Logf("n1: %d %s Retry-After %q, %v of the breaker left at the latest", r.status, r.problemType(), r.header.Get("Retry-After"), left)
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded || err != nil {
		t.Fatalf("n1: %d %q Retry-After %q; want 503 not-forwarded with Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	if time.Duration(ra)*time.Second < left || ra > 5 {
		t.Errorf("n1: Retry-After %d; the breaker lets no probe through for %v more: want %d to 5", ra, left, int((left+time.Second-1)/time.Second))
	}
}

// TestUpstream503RetryAfterKept: the upstream's own 503 is its answer,
// passed on with its Retry-After as it came, even while the breaker is
// open: a guarded request's (claimed before Redis went away), and an
// unguarded one's on a soft route.
func TestUpstream503RetryAfterKept(t *testing.T) {
	srv := testenv.StartRedis(t)
	u := newUpstream(t)
	arrived := make(chan struct{})
	answer := make(chan struct{})
	u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
		switch order {
		case "u1":
			close(arrived)
			<-answer
		case "s1":
		default:
			return false
		}
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["`+srv.Addr()+`"], prefix: "{prefix}"}
fallback: {policy: fail-closed, timeout: 300ms, failures_to_open: 1, open_timeout: 5s}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
  - pattern: POST /carts
    requirement: soft
`, u.URL)
	replies := make(chan reply, 1)
	go func() { replies <- post(t, e.srv.URL+"/orders", "k-u1", `{"order":"u1"}`, "X-Account-Id", "acme") }()
	<-arrived // u1 was forwarded
	srv.Kill()
	if r := post(t, e.srv.URL+"/orders", "k-u2", `{"order":"u2"}`, "X-Account-Id", "acme"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("u2 with Redis down: %d %s", r.status, r.body)
	}
	if s := e.gw.fb.State(); s != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", s)
	}
	// A request without a key on a soft route is passed through, unguarded.
	if r := post(t, e.srv.URL+"/carts", "", `{"order":"s1"}`, "X-Account-Id", "acme"); r.status != http.StatusServiceUnavailable ||
		r.header.Get("Retry-After") != "2" {
		t.Errorf("s1, unguarded: %d Retry-After %q %s; want the upstream's 503 with its Retry-After 2", r.status, r.header.Get("Retry-After"), r.body)
	}
	close(answer)
	r := <-replies
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "2" {
		t.Fatalf("u1: %d Retry-After %q %s; want the upstream's 503 with its Retry-After 2", r.status, r.header.Get("Retry-After"), r.body)
	}
}
