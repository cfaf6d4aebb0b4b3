package proof

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// The checkout of the step tests: reserve stock, charge through a
// Stripe-like service that honours Idempotency-Key, create the order. The
// stock and order services are not idempotent: a second call is a second
// reservation or order, which only the steps prevent. Each step's result
// names the attempt that stored it.

// shop is the fake downstream: one HTTP server with /reserve, /charges
// and /orders, counting what each guard key (the form field id) and each
// idempotency key caused.
type shop struct {
	srv *httptest.Server

	mu        sync.Mutex
	reserves  map[string]int             // by guard key ID
	orders    map[string]int             // by guard key ID
	charged   map[string]int             // charges made, by guard key ID
	chargeFor map[string]map[string]bool // idempotency keys received, by guard key ID
	requests  map[string]int             // charge requests, by idempotency key
	answers   map[string]string          // the first answer, by idempotency key
	n         int
}

func newShop(t testing.TB) *shop {
	s := &shop{reserves: map[string]int{}, orders: map[string]int{}, charged: map[string]int{},
		chargeFor: map[string]map[string]bool{}, requests: map[string]int{}, answers: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *shop) serve(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost || r.PostForm.Get("id") == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	id := r.PostForm.Get("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	switch r.URL.Path {
	case "/reserve":
		s.reserves[id]++
		fmt.Fprintf(w, "res_%d", s.n)
	case "/orders":
		s.orders[id]++
		fmt.Fprintf(w, "ord_%d", s.n)
	case "/charges":
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
			return
		}
		s.requests[key]++
		if s.chargeFor[id] == nil {
			s.chargeFor[id] = map[string]bool{}
		}
		s.chargeFor[id][key] = true
		if a, ok := s.answers[key]; ok {
			w.Header().Set("Idempotent-Replayed", "true")
			io.WriteString(w, a)
			return
		}
		s.charged[id]++
		a := fmt.Sprintf("ch_%d", s.n)
		s.answers[key] = a
		io.WriteString(w, a)
	default:
		http.NotFound(w, r)
	}
}

// The places a holder is stopped: after each step, and inside the charge
// step after the charge was made but before its result was stored.
var killPoints = []string{"after-reserve", "mid-charge", "after-charge", "after-order"}

// errStopped is how a stopped holder's effect ends in the cancelled mode.
var errStopped = errors.New("holder stopped")

// checkout is the effect for the shop at base. stop is called at every
// kill point with its name; an error it returns ends the effect there
// (inside the charge step: the step fails, nothing stored).
func checkout(client *http.Client, base string, stop func(ctx context.Context, l guard.Lease, point string) error) guard.Func {
	post := func(ctx context.Context, path, id string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(url.Values{"id": {id}}.Encode()))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s %s", path, resp.Status, b)
		}
		return string(b), nil
	}
	return func(ctx context.Context, l guard.Lease) ([]byte, error) {
		id := l.Key.ID
		stamp := func(v string) string { return fmt.Sprintf("%s@%d", v, l.Attempt) }
		res, err := guard.Step(ctx, l, "reserve", func(ctx context.Context) (string, error) {
			v, err := post(ctx, "/reserve", id)
			return stamp(v), err
		})
		if err != nil {
			return nil, err
		}
		if err := stop(ctx, l, "after-reserve"); err != nil {
			return nil, err
		}
		ch, err := guard.Step(ctx, l, "charge", func(ctx context.Context) (string, error) {
			// The charge's key is the same in every attempt: a charge made
			// by an attempt that died before storing it is answered again,
			// not made again.
			v, err := post(httpx.WithIdempotencyKey(ctx, l.KeyFor("charge")), "/charges", id)
			if err != nil {
				return "", err
			}
			if err := stop(ctx, l, "mid-charge"); err != nil {
				return "", err
			}
			return stamp(v), nil
		})
		if err != nil {
			return nil, err
		}
		if err := stop(ctx, l, "after-charge"); err != nil {
			return nil, err
		}
		ord, err := guard.Step(ctx, l, "order", func(ctx context.Context) (string, error) {
			v, err := post(ctx, "/orders", id)
			return stamp(v), err
		})
		if err != nil {
			return nil, err
		}
		if err := stop(ctx, l, "after-order"); err != nil {
			return nil, err
		}
		return []byte(res + " " + ch + " " + ord), nil
	}
}

func noStop(context.Context, guard.Lease, string) error { return nil }

func shopClient(t testing.TB) *http.Client {
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(base.CloseIdleConnections)
	return httpx.NewClient(httpx.TransportOptions{Base: base, BaseDelay: 5 * time.Millisecond})
}

const stepKeys = 200 // keys per kill point

// stepKey is key i of kill point point.
func stepKey(point string, i int) guard.Key {
	return guard.Key{Scope: "checkout/" + point, ID: fmt.Sprintf("cart-%03d", i)}
}

// parallel runs fn for 0..n-1 on 32 goroutines.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				fn(i)
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// resumeAndCheck runs every key of point to completion with no stop, then
// checks the shop and the records: each key reserved, charged and
// ordered exactly once, its charge sent with its derived key (twice when
// the holder was stopped mid-charge: the retry sent the same key and got
// the first answer), and the steps before the kill point stored by
// attempt 1, those after by the retry.
func resumeAndCheck(t *testing.T, g *guard.Guard, sh *shop, point string, recovered bool) {
	t.Helper()
	client := shopClient(t)
	results := make([]guard.Result, stepKeys)
	parallel(stepKeys, func(i int) {
		results[i] = resume(t, g, stepKey(point, i), checkout(client, sh.srv.URL, noStop))
	})
	before := map[string]int{"after-reserve": 1, "mid-charge": 1, "after-charge": 2, "after-order": 3}[point]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	bad := 0
	for i, res := range results {
		k := stepKey(point, i)
		id := k.ID
		dk := guard.DownstreamKey(k, "charge")
		wantRequests := 1
		if point == "mid-charge" {
			wantRequests = 2
		}
		parts := strings.Fields(string(res.Value))
		var problems []string
		if sh.reserves[id] != 1 || sh.orders[id] != 1 || sh.charged[id] != 1 {
			problems = append(problems, fmt.Sprintf("reserved %d, charged %d, ordered %d times", sh.reserves[id], sh.charged[id], sh.orders[id]))
		}
		if len(sh.chargeFor[id]) != 1 || !sh.chargeFor[id][dk] || sh.requests[dk] != wantRequests {
			problems = append(problems, fmt.Sprintf("charge keys %v (requests %d), want only %s, %d requests", sh.chargeFor[id], sh.requests[dk], dk, wantRequests))
		}
		if res.Replayed || res.Lease.Attempt != 2 || res.Lease.Recovered != recovered {
			problems = append(problems, fmt.Sprintf("the retry was %+v, want attempt 2, recovered %t", res.Lease, recovered))
		}
		if len(parts) != 3 {
			problems = append(problems, fmt.Sprintf("result %q", res.Value))
		} else {
			for j, p := range parts {
				want := "@2"
				if j < before {
					want = "@1"
				}
				if !strings.HasSuffix(p, want) {
					problems = append(problems, fmt.Sprintf("step %d stored as %q, want it from attempt %s", j+1, p, want[1:]))
				}
			}
			if ch, _, _ := strings.Cut(parts[1], "@"); ch != sh.answers[dk] {
				problems = append(problems, fmt.Sprintf("charge %q, the service made %q", ch, sh.answers[dk]))
			}
		}
		if len(problems) > 0 {
			bad++
			if bad <= 5 {
				t.Errorf("%s: %s", k, strings.Join(problems, "; "))
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d keys wrong", point, bad, stepKeys)
	}
	for i := range stepKeys {
		if rec, err := g.Get(context.Background(), stepKey(point, i)); err != nil || rec.State != guard.StateCompleted || rec.Steps != nil {
			t.Fatalf("%s: record %+v, %v; want completed, steps dropped", stepKey(point, i), rec, err)
		}
	}
}

// resume runs Do on key until it answers, waiting out the stopped
// holder's lease; any other error fails the test at once.
func resume(t *testing.T, g *guard.Guard, key guard.Key, fn guard.Func) guard.Result {
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := g.Do(context.Background(), key, "fp", fn)
		var ip *guard.InProgressError
		switch {
		case err == nil:
			return res
		case !errors.As(err, &ip) || time.Now().After(deadline):
			t.Errorf("%s: the retry = %v", key, err)
			return res
		}
		time.Sleep(ip.RetryAfter + time.Millisecond) // waiting for the stopped holder's lease to run out
	}
}

// TestStepsResumeAfterCancel: 200 keys for each kill point; each holder's
// context is cancelled there (a client hanging up, a shutdown) and its
// effect returns without completing, so the attempt is recorded as
// failed. The retries resume: every step's side effect happened exactly
// once per key.
func TestStepsResumeAfterCancel(t *testing.T) {
	g := guard.New(guardenv.Store(t, guard.RedisOptions{}), guard.Options{Lease: 10 * time.Second, TTL: time.Hour})
	for _, point := range killPoints {
		t.Run(point, func(t *testing.T) {
			sh := newShop(t)
			client := shopClient(t)
			parallel(stepKeys, func(i int) {
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				_, err := g.Do(ctx, stepKey(point, i), "fp", checkout(client, sh.srv.URL, func(ctx context.Context, _ guard.Lease, at string) error {
					if at != point {
						return nil
					}
					cancel(errStopped)
					return context.Cause(ctx)
				}))
				if !errors.Is(err, errStopped) {
					t.Errorf("%s: stopped holder's Do = %v, want its error", stepKey(point, i), err)
				}
			})
			resumeAndCheck(t, g, sh, point, false)
		})
	}
}

// errAbandon unwinds a holder that stops dead: no write follows.
type errAbandon struct{}

// TestStepsResumeAfterAbandon: as TestStepsResumeAfterCancel, but the
// holder stops dead at the kill point (its goroutine is gone, nothing is
// written: a crash), so the retry recovers the key once its lease has run
// out.
func TestStepsResumeAfterAbandon(t *testing.T) {
	lease := time.Second
	g := guard.New(guardenv.Store(t, guard.RedisOptions{}), guard.Options{Lease: lease, TTL: time.Hour})
	for _, point := range killPoints {
		t.Run(point, func(t *testing.T) {
			sh := newShop(t)
			client := shopClient(t)
			parallel(stepKeys, func(i int) {
				out, err := g.Claim(context.Background(), stepKey(point, i), "fp")
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				defer func() {
					if p := recover(); p != nil && p != (errAbandon{}) {
						panic(p)
					}
				}()
				_, _ = checkout(client, sh.srv.URL, func(_ context.Context, _ guard.Lease, at string) error {
					if at == point {
						panic(errAbandon{})
					}
					return nil
				})(context.Background(), out.Lease)
				t.Errorf("%s: the holder was not stopped", stepKey(point, i))
			})
			resumeAndCheck(t, g, sh, point, true)
		})
	}
}

// The step child's settings, passed by TestStepsResumeAfterSIGKILL.
const (
	stepChildEnv    = "IDEMGUARD_PROOF_STEP_CHILD" // the kill point; set only in a child
	stepChildShop   = "IDEMGUARD_PROOF_STEP_SHOP"
	stepChildPrefix = "IDEMGUARD_PROOF_STEP_PREFIX"
	stepChildLease  = "IDEMGUARD_PROOF_STEP_LEASE"
)

// childLease is the lease the step child holds its keys with at first:
// SIGKILL stops its heartbeat, and the parent's retries recover them
// after it.
const childLease = 2 * time.Second

// TestStepsResumeAfterSIGKILL: for each kill point, a child process (this
// test binary, run again) runs 200 keys' checkouts with a real heartbeat
// and stops each at the kill point; once all 200 are there, the parent
// kills it with SIGKILL and runs the keys again. Every step's side effect
// happened exactly once per key.
//
// The child must hold all 200 leases until the kill. A child a loaded
// machine starves past a lease's deadline loses some before they reach
// the point (at load ~22: "lease lost: the lease's deadline passed
// without a successful extension" for 2 of 200 keys, twice; claims
// "answered after the lease's deadline, so not used"): such a round
// proves nothing about resuming after a kill, and runs again with a lease
// twice as long, on keys of its own (testenv.OnTime). Any other end of a
// child's Do fails the test, as does every round being late.
func TestStepsResumeAfterSIGKILL(t *testing.T) {
	if os.Getenv(stepChildEnv) != "" || os.Getenv(childEnv) != "" {
		t.Skip("child process")
	}
	t.Parallel() // a drill: see TestMain
	for _, point := range killPoints {
		t.Run(point, func(t *testing.T) {
			testenv.OnTime(t, "a child lease", childLease, 3, func(lease time.Duration) bool {
				return killChildAt(t, point, lease)
			})
		})
	}
}

// killChildAt runs one round of TestStepsResumeAfterSIGKILL at point with
// the child holding its keys with lease; it reports whether the round was
// late: the child lost a lease before all its keys reached the point.
func killChildAt(t *testing.T, point string, lease time.Duration) bool {
	t.Helper()
	prefix := testenv.Prefix(t)
	g := guard.New(guardenv.Store(t, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: lease, TTL: time.Hour})
	sh := newShop(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestStepsChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), stepChildEnv+"="+point, stepChildShop+"="+sh.srv.URL, stepChildPrefix+"="+prefix,
		stepChildLease+"="+lease.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	// Each key says once where it is: at the point ("at"); returned late
	// ("late": its lease lost, or a call the lease bounds, the claim or an
	// extension, answered after its deadline); or returned otherwise
	// ("returned", which ends the wait).
	at, late := map[string]bool{}, map[string]bool{}
	lines := bufio.NewScanner(stdout)
	timer := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	for len(at)+len(late) < stepKeys && lines.Scan() {
		if id, ok := strings.CutPrefix(lines.Text(), "at "); ok {
			at[id] = true
		} else if id, ok := strings.CutPrefix(lines.Text(), "late "); ok {
			late[id] = true
		} else if strings.HasPrefix(lines.Text(), "returned ") {
			break
		}
	}
	timer.Stop()
	if len(at) < stepKeys {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		exited = true
		if len(at)+len(late) == stepKeys {
			t.Logf("%d of %d keys of the child, with leases of %s, were late before the kill point %s (lease lost, or claim or extension answered past its deadline)",
				len(late), stepKeys, lease, point)
			return true
		}
		t.Fatalf("the child stopped %d of %d keys at %s before it ended (%d late):\n%s", len(at), stepKeys, point, len(late), stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	exited = true
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL:\n%s", err, stderr.String())
	}
	// The child held every key, its leases alive until the kill.
	for i := range stepKeys {
		rec, err := g.Get(context.Background(), stepKey(point, i))
		if err != nil || rec.State != guard.StatePending || rec.Attempt != 1 {
			t.Fatalf("%s after the kill: %+v, %v; want pending at attempt 1", stepKey(point, i), rec, err)
		}
	}
	resumeAndCheck(t, g, sh, point, true)
	return false
}

// TestStepsChild is the child side of TestStepsResumeAfterSIGKILL; it
// runs only in a child process, and is killed there.
func TestStepsChild(t *testing.T) {
	point := os.Getenv(stepChildEnv)
	if point == "" {
		t.Skip("runs only as a child of TestStepsResumeAfterSIGKILL")
	}
	lease, err := time.ParseDuration(os.Getenv(stepChildLease))
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(guardenv.Store(t, guard.RedisOptions{Prefix: os.Getenv(stepChildPrefix)}), guard.Options{Lease: lease, TTL: time.Hour})
	client := shopClient(t)
	var out sync.Mutex
	block := make(chan struct{}) // never closed: the holder waits here for SIGKILL
	var wg sync.WaitGroup
	for i := range stepKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := g.Do(context.Background(), stepKey(point, i), "fp", checkout(client, os.Getenv(stepChildShop),
				func(_ context.Context, l guard.Lease, at string) error {
					if at == point {
						out.Lock()
						fmt.Println("at " + l.Key.ID)
						out.Unlock()
						<-block
					}
					return nil
				}))
			fmt.Fprintf(os.Stderr, "%s: Do returned %v\n", stepKey(point, i), err)
			out.Lock()
			if errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, guard.ErrUnavailable) {
				fmt.Println("late " + stepKey(point, i).ID) // a bound the lease sets ran out
			} else {
				fmt.Println("returned " + stepKey(point, i).ID)
			}
			out.Unlock()
		}()
	}
	wg.Wait()
	t.Error("every key returned: none was stopped")
}
