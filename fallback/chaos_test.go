package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/adapter"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// The chaos test of the issue: a storm of 2,000 POSTs through httpx.Guard
// with 30% duplicate keys; redis-server is killed with SIGKILL a quarter of
// the way in and restarted (empty, same port) later. The handler writes a
// business row and the SQL backstop row in one transaction. Checked: zero
// duplicated business rows; every request answered 201 (fresh or replay),
// 409 or 503 within a bound; after recovery every key replays (a key
// completed during the outage replays from the secondary's record instead
// of running again). With FailClosed: every handler run held a lease from
// the primary, and effects equal fresh 2xx answers.
func TestChaosStormKillRestart(t *testing.T) {
	t.Run("Secondary", func(t *testing.T) { t.Parallel(); chaos(t, fallback.Secondary, 2000) })
	// Half the storm: it shows the same (nothing runs unguarded) at half
	// the cost on a shared 2-core machine.
	t.Run("FailClosed", func(t *testing.T) { t.Parallel(); chaos(t, fallback.FailClosed, 1000) })
}

const (
	stormDupShare = 0.30
	stormWorkers  = 32
	killShare     = 0.25 // share of the requests sent before the kill
	restartShare  = 0.65 // share sent before the restart
	// recoveryBound is how long after recovery a key may go without its
	// 201, counted from its first try or its last try of unknown outcome:
	// the guard's lease (10 s), which a claim the primary took unheard
	// holds, and 5 s for that claim to reach the primary and the retry
	// after the lease to be answered on a loaded machine.
	recoveryBound = 15 * time.Second
	// recoveryGiveUp bounds a key's recovery whatever its answers.
	recoveryGiveUp = 2 * time.Minute
)

// answerBound is how long a request of the storm may take to be answered
// with opts and the guard's lease: nothing answers later, short of a
// hang. Each term is a bound of the code's, not of this machine:
//   - the claim: guard ends it by its lease's validity (lease −
//     LeaseMargin), and a claim the switch-back check turns down is
//     undone past that, within opts.Timeout (Store.undo);
//   - the handler's transaction, which no bound of the code covers: it
//     gets one opts.SecondaryTimeout, what this test lets every
//     PostgreSQL call of the secondary take;
//   - the write that ends the claim (Complete, or the Release of a 503):
//     httpx tries it again while the store is unreachable, for
//     adapter.SettleBudget, and guard bounds each try by max(lease, 1s)
//     (its detached writes); a Complete that still finds the store
//     unreachable is followed by one Release of at most a second
//     (adapter.Ender). A claim acquired past its validity is released
//     within the same bounds and has no handler run.
//
// A fixed 15 s was below it: an answer took 15.18 s at load 20–37. The
// slowest answer here is the request whose Complete meets the kill: it
// is tried again for SettleBudget (2 s) before the primary's
// unavailability is final.
func answerBound(opts fallback.Options, lease time.Duration) time.Duration {
	return lease - guard.LeaseMargin(lease) + opts.Timeout + opts.SecondaryTimeout +
		adapter.SettleBudget + max(lease, time.Second) + time.Second
}

// slot carries the lease httpx.Guard acquired to the handler (httpx does
// not expose it): a middleware outside httpx.Guard puts an empty slot in
// the request context, and leaseTap, a pass-through Store around the
// fallback, fills it when the claim made with that context is acquired.
type slot struct {
	mu          sync.Mutex
	lease       guard.Lease
	fingerprint string
	started, at time.Time // when the claim was sent and answered
	ok          bool
	// When the request reached the server, the handler began and ended,
	// and the server was done with it: where a slow answer's time went.
	arrived, ran, handled, served time.Time
	completing, completed         time.Time // the holder's last try of Complete, if any
}

// phases tells where a request's time went on the server.
func (sl *slot) phases() string {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	since := func(from, to time.Time) string {
		if from.IsZero() || to.IsZero() {
			return "-"
		}
		return to.Sub(from).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("claim answered %s after arrival (acquired: %t, the store took %s), handler %s, then %s to the end (the last try of Complete sent %s after the handler, took %s), served in %s",
		since(sl.arrived, sl.at), sl.ok, since(sl.started, sl.at), since(sl.ran, sl.handled), since(sl.handled, sl.served),
		since(sl.handled, sl.completing), since(sl.completing, sl.completed), since(sl.arrived, sl.served))
}

type slotKey struct{}

type leaseTap struct {
	guard.Store
	lost *sync.Map // key ID → true: a holder's Complete failed (its result was not stored)
}

func (s leaseTap) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	started := time.Now()
	err := s.Store.Complete(ctx, lease, result, ttl)
	if sl, _ := ctx.Value(slotKey{}).(*slot); sl != nil {
		sl.mu.Lock()
		sl.completing, sl.completed = started, time.Now()
		sl.mu.Unlock()
	}
	if err != nil {
		s.lost.Store(lease.Key.ID, true)
	}
	return err
}

func (s leaseTap) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	started := time.Now()
	out, err := s.Store.Claim(ctx, req)
	if sl, _ := ctx.Value(slotKey{}).(*slot); sl != nil && err == nil && out.Status == guard.Acquired {
		sl.mu.Lock()
		sl.lease, sl.fingerprint, sl.started, sl.at, sl.ok = out.Lease, req.Fingerprint, started, time.Now(), true
		sl.mu.Unlock()
	}
	return out, err
}

// whilePrimaryDead reports whether a claim ran entirely while the primary
// was dead: begun after the kill had finished, answered before the restart
// began. Such a lease cannot have come from the primary.
func (st *storm) whilePrimaryDead(started, answered time.Time) bool {
	k, r := st.killed.Load(), st.restarting.Load()
	return k != 0 && started.UnixNano() > k && (r == 0 || answered.UnixNano() < r)
}

// storm is what one chaos run observed.
type storm struct {
	handlerRuns, unguarded, committed, caught, handler503 atomic.Int64
	duringOutage                                          atomic.Int64 // handler runs under a lease claimed while the primary was dead
	killed, restarting                                    atomic.Int64 // unix ns: the kill had finished; the restart began
	mu                                                    sync.Mutex
	outageKeys                                            map[string]bool // committed under a lease claimed while the primary was dead
}

func chaos(t *testing.T, policy fallback.Policy, stormRequests int) {
	killAt, restartAt := int64(float64(stormRequests)*killShare), int64(float64(stormRequests)*restartShare)
	p := newPrimary(t)
	if err := p.store.LoadScripts(bg); err != nil {
		t.Fatal(err)
	}
	pg, db := pgStore(t)
	// The backstop keeps its rows in tables of its own: the secondary's
	// records hold httpx's encoded responses, the backstop's the
	// business result.
	bopts := pgstore.Options{TablePrefix: "backstop_"}
	if err := pgstore.Migrate(bg, db, bopts); err != nil {
		t.Fatal(err)
	}
	b, err := backstop.New(db, bopts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(bg, `CREATE TABLE payments (idem_key text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	opts := fallback.Options{Policy: policy, Timeout: 500 * time.Millisecond, SecondaryTimeout: 5 * time.Second,
		FailuresToOpen: 3, OpenTimeout: 250 * time.Millisecond, Logger: quiet}
	if policy == fallback.Secondary {
		opts.Secondary = pg
	}
	fb := newStore(t, p.store, opts)
	var lost sync.Map
	const lease = 10 * time.Second
	g := guard.New(leaseTap{Store: fb, lost: &lost}, guard.Options{Lease: lease, TTL: time.Hour})
	st := &storm{outageKeys: map[string]bool{}}

	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sl := r.Context().Value(slotKey{}).(*slot)
		sl.mu.Lock()
		sl.ran = time.Now()
		lease, fp, ok := sl.lease, sl.fingerprint, sl.ok
		dead := st.whilePrimaryDead(sl.started, sl.at)
		sl.mu.Unlock()
		defer func() {
			sl.mu.Lock()
			sl.handled = time.Now()
			sl.mu.Unlock()
		}()
		st.handlerRuns.Add(1)
		if dead {
			st.duringOutage.Add(1)
		}
		if !ok || fallback.Unguarded(lease) || lease.Fence < 1 {
			st.unguarded.Add(1)
		}
		unavailable := func() {
			st.handler503.Add(1)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable) // 5xx: httpx releases the key
		}
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			unavailable()
			return
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments (idem_key, amount) VALUES ($1, 1)`, lease.Key.ID); err != nil {
			unavailable()
			return
		}
		result := []byte("paid " + lease.Key.ID)
		var done *backstop.AlreadyCommittedError
		switch err := b.Commit(r.Context(), tx, lease, fp, result); {
		case errors.As(err, &done):
			st.caught.Add(1) // the guard let a repeat through; the backstop row stopped it
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(done.Result)
			return
		case err != nil:
			unavailable()
			return
		}
		if err := tx.Commit(); err != nil {
			unavailable()
			return
		}
		st.committed.Add(1)
		if dead {
			st.mu.Lock()
			st.outageKeys[lease.Key.ID] = true
			st.mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(result)
	})
	guarded := httpx.Guard(g, httpx.Options{Logger: testenv.LoggerAt(t, slog.LevelError), SingleCaller: true})(pay)
	mux := http.NewServeMux()
	var slots sync.Map // request number → *slot
	mux.Handle("POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sl := &slot{arrived: time.Now()}
		slots.Store(r.Header.Get("X-Request-Number"), sl)
		guarded.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), slotKey{}, sl)))
		sl.mu.Lock()
		sl.served = time.Now()
		sl.mu.Unlock()
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	bound := answerBound(opts, lease)
	// The client waits past the bound, so that an answer over it is
	// measured and told apart from none.
	client := &http.Client{Timeout: 2 * bound, Transport: &http.Transport{MaxIdleConnsPerHost: stormWorkers}}
	defer client.CloseIdleConnections()

	var requests atomic.Int64
	// post sends a payment of key id; server tells where its time went on
	// the server.
	post := func(id string) (status int, replayed bool, took time.Duration, server string, err error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", id)
		n := fmt.Sprint(requests.Add(1))
		req.Header.Set("X-Request-Number", n)
		defer func() {
			if sl, ok := slots.LoadAndDelete(n); ok {
				server = sl.(*slot).phases()
			}
		}()
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, false, time.Since(start), "", err
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated, http.StatusConflict, http.StatusServiceUnavailable:
		default: // the storm's check fails on it: say what it was
			body, _ := io.ReadAll(resp.Body)
			t.Logf("POST %s answered %d: %s", id, resp.StatusCode, body)
		}
		return resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader) == "true", time.Since(start), "", nil
	}

	// The requests: 70% distinct keys, 30% duplicates sent close to their
	// original so many meet it in flight.
	rng := rand.New(rand.NewPCG(1, 2))
	unique := int(float64(stormRequests) * (1 - stormDupShare))
	type item struct {
		pos float64
		id  string
	}
	var items []item
	for i := range unique {
		items = append(items, item{float64(i), fmt.Sprintf("key-%04d", i)})
	}
	for range stormRequests - unique {
		j := rng.IntN(unique)
		items = append(items, item{float64(j) + rng.Float64()*40, fmt.Sprintf("key-%04d", j)})
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].pos < items[b].pos })

	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		fresh    = map[string]int{} // fresh 201s per key during the storm
		slowest  time.Duration
		slowKey  string // the slowest request's key and where its time went
		sent     atomic.Int64
	)
	jobs := make(chan string)
	reachedKill, reachedRestart := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	// A Fatal below while the workers run must not end the test before
	// them: a worker's Errorf after the end panics the whole test binary.
	t.Cleanup(wg.Wait)
	for range stormWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				switch sent.Add(1) {
				case killAt:
					close(reachedKill)
				case restartAt:
					close(reachedRestart)
				}
				status, replayed, took, server, err := post(id)
				mu.Lock()
				if err != nil {
					t.Errorf("POST %s: no answer: %v (server: %s)", id, err, server)
				}
				statuses[status]++
				if status == http.StatusCreated && !replayed {
					fresh[id]++
				}
				if took > slowest {
					slowest, slowKey = took, fmt.Sprintf("%s, answered %d: %s", id, status, server)
				}
				mu.Unlock()
			}
		}()
	}
	stormStart := time.Now()
	go func() {
		for _, it := range items {
			jobs <- it.id
		}
		close(jobs)
	}()
	<-reachedKill
	killStart := time.Now()
	p.srv.Kill()
	st.killed.Store(time.Now().UnixNano())
	<-reachedRestart
	restartStart := time.Now()
	st.restarting.Store(restartStart.UnixNano())
	p.srv.Restart()
	wg.Wait()
	stormTook := time.Since(stormStart)

	for status := range statuses {
		switch status {
		case http.StatusCreated, http.StatusConflict, http.StatusServiceUnavailable:
		default:
			t.Errorf("%d requests answered %d", statuses[status], status)
		}
	}
	if slowest > bound {
		t.Errorf("slowest answer took %s, bound %s (%s)", slowest, bound, slowKey)
	}
	if statuses[http.StatusServiceUnavailable] == 0 && policy == fallback.FailClosed {
		t.Errorf("no 503 under FailClosed: the outage was not hit")
	}
	caughtInStorm := st.caught.Load()

	// Recovery: the breaker closes on the restarted (empty) Redis; every
	// key is retried until it answers 201.
	recoveryStart := time.Now()
	closeBreaker(t, fb, 10*time.Second)
	var outageReplays, recoveryFresh, recoveryCaught, lostOutage, recoveryUnknown atomic.Int64
	var longestKey atomic.Int64 // ns: the longest a key took to its 201 after recovery
	caughtBefore := st.caught.Load()
	mu.Lock()
	var freshTotal atomic.Int64
	for _, n := range fresh {
		freshTotal.Add(int64(n))
	}
	mu.Unlock()
	ids := make(chan string)
	var (
		rwg       sync.WaitGroup
		recovered sync.Map // key ID → true: answered 201 after recovery
	)
	for range stormWorkers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for id := range ids {
				// The key's 201 is due within recoveryBound of its first
				// try, or of its last try whose claim's fate it could not
				// know (a 503 or no answer), whichever is later: that claim
				// may have reached the primary unheard (cut off at the
				// fallback's Timeout while go-redis still sends it), and
				// then nobody holds its lease, which runs out on its own
				// (guard.Claim), the key answering 409 until then. A 409
				// outlasting that (a lease kept alive after its run, a
				// handler that never ends) still fails, and so does a key
				// never answered 201 within recoveryGiveUp.
				first := time.Now()
				due, unknowns := first.Add(recoveryBound), 0
				for {
					status, replayed, _, _, err := post(id)
					if err == nil && status == http.StatusCreated {
						recovered.Store(id, true)
						took := int64(time.Since(first))
						for cur := longestKey.Load(); took > cur && !longestKey.CompareAndSwap(cur, took); cur = longestKey.Load() {
						}
						st.mu.Lock()
						outage := st.outageKeys[id]
						st.mu.Unlock()
						switch {
						case replayed && outage:
							outageReplays.Add(1)
						case !replayed && outage:
							if _, ok := lost.Load(id); ok {
								// Its holder's Complete failed (an overloaded
								// secondary): the guard could not know; the
								// backstop row kept the effect single.
								lostOutage.Add(1)
							} else {
								t.Errorf("key %s, completed in the secondary during the outage, ran again after recovery", id)
							}
						case !replayed:
							recoveryFresh.Add(1)
						}
						if !replayed {
							freshTotal.Add(1)
						}
						break
					}
					now := time.Now()
					if err != nil || status == http.StatusServiceUnavailable {
						due, unknowns = now.Add(recoveryBound), unknowns+1
						recoveryUnknown.Add(1)
					}
					if now.After(due) || now.Sub(first) > recoveryGiveUp {
						rec, gerr := p.get(t, guard.Key{Scope: "POST /pay", ID: id})
						t.Errorf("key %s: no 201 within %s of its first try or its last of unknown outcome (%d of them, %s since the first; last %d, %v); its record in the primary: %+v, %v",
							id, recoveryBound, unknowns, now.Sub(first).Round(time.Millisecond), status, err, rec, gerr)
						break
					}
					time.Sleep(20 * time.Millisecond) // a client's pause before retrying 409/503
				}
			}
		}()
	}
	// Retried: every key that got no 201 in the storm, every other key
	// completed during the outage, and every eighth of the rest.
	mu.Lock()
	st.mu.Lock()
	var retry []string
	for i := range unique {
		id := fmt.Sprintf("key-%04d", i)
		if fresh[id] == 0 || st.outageKeys[id] && i%2 == 0 || i%8 == 0 {
			retry = append(retry, id)
		}
	}
	st.mu.Unlock()
	mu.Unlock()
	for _, id := range retry {
		ids <- id
	}
	close(ids)
	rwg.Wait()
	recoveryTook := time.Since(recoveryStart)
	recoveryCaught.Store(st.caught.Load() - caughtBefore)

	// The business table: exactly one row per key, never two.
	var dupKeys, rows, keys int
	if err := db.QueryRowContext(bg, `SELECT count(*) FROM (SELECT idem_key FROM payments GROUP BY idem_key HAVING count(*) > 1) d`).Scan(&dupKeys); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(bg, `SELECT count(*), count(DISTINCT idem_key) FROM payments`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if dupKeys != 0 || rows != keys {
		t.Errorf("business rows: %d rows for %d keys, %d keys duplicated; want none duplicated", rows, keys, dupKeys)
	}
	// Every key that was answered 201 (fresh in the storm, or fresh or a
	// replay after recovery) has its row.
	answered := map[string]bool{}
	mu.Lock()
	for id := range fresh {
		answered[id] = true
	}
	mu.Unlock()
	recovered.Range(func(id, _ any) bool {
		answered[id.(string)] = true
		return true
	})
	var missing int
	for id := range answered {
		var n int
		if err := db.QueryRowContext(bg, `SELECT count(*) FROM payments WHERE idem_key = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			missing++
		}
	}
	if missing != 0 {
		t.Errorf("%d keys answered 201 without exactly one business row", missing)
	}
	if int64(rows) != st.committed.Load() {
		t.Errorf("%d rows but %d committed effects", rows, st.committed.Load())
	}
	if n := st.unguarded.Load(); n != 0 {
		t.Errorf("%d handler runs without a lease from a store", n)
	}
	// Effects against fresh answers: every handler run that did not answer
	// 503 answered exactly one fresh (non-replayed) 201, and every fresh
	// 201 came from a handler run.
	if got, want := freshTotal.Load(), st.committed.Load()+st.caught.Load(); got != want {
		t.Errorf("fresh 201s %d, effects %d (committed %d + caught %d)", got, want, st.committed.Load(), st.caught.Load())
	}
	switch policy {
	case fallback.Secondary:
		st.mu.Lock()
		outage := len(st.outageKeys)
		st.mu.Unlock()
		if outage == 0 || outageReplays.Load() == 0 {
			t.Errorf("keys completed during the outage: %d; replayed after recovery: %d", outage, outageReplays.Load())
		}
	case fallback.FailClosed:
		// Nothing but the primary can give a lease, so no claim made
		// while it was dead may have been acquired.
		if n := st.duringOutage.Load(); n != 0 {
			t.Errorf("%d handler runs got a lease claimed while the primary was dead", n)
		}
	}
	t.Logf("storm %s (before the kill %s, outage %s, after %s; repeats caught by the backstop: %d), recovery %s (longest key %s; tries of unknown outcome %d)",
		stormTook.Round(time.Millisecond), killStart.Sub(stormStart).Round(time.Millisecond), restartStart.Sub(killStart).Round(time.Millisecond),
		stormStart.Add(stormTook).Sub(restartStart).Round(time.Millisecond), caughtInStorm, recoveryTook.Round(time.Millisecond),
		time.Duration(longestKey.Load()).Round(time.Millisecond), recoveryUnknown.Load())
	t.Logf("slowest answer %s of bound %s: %s", slowest.Round(time.Millisecond), bound, slowKey)
	t.Logf("%v: statuses %v; slowest %s; handler runs %d, committed %d, caught by backstop %d (during recovery %d), handler 503s %d; outage keys replayed %d, re-run after a lost completion %d; fresh after recovery %d",
		policy, statuses, slowest.Round(time.Millisecond), st.handlerRuns.Load(), st.committed.Load(), st.caught.Load(),
		recoveryCaught.Load(), st.handler503.Load(), outageReplays.Load(), lostOutage.Load(), recoveryFresh.Load())
}
