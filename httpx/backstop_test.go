package httpx_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// charges is a payments service: POST /charges inserts a charge and
// commits it with the response through httpx.CommitResponse, behind
// httpx.Guard over a guard whose store the test chooses.
type charges struct {
	db      *sql.DB
	b       *backstop.Backstop
	rs      *guard.RedisStore
	rdb     redis.UniversalClient
	g       *guard.Guard
	handler http.Handler

	// hook, if set, runs in the handler after the charge is inserted and
	// before CommitResponse, with the request's lease.
	hook func(r *http.Request, tx *sql.Tx, lease guard.Lease)
	// respond, if set, gives the response to commit instead of the
	// charge's 201 (it may set header fields).
	respond func(h http.Header, id int64) (status int, body []byte)
	// after, if set, runs with the response header after CommitResponse.
	after func(h http.Header)
	// outcomes counts CommitResponse's results by error class.
	mu       sync.Mutex
	outcomes map[string]int
}

// chargesOptions shape the service.
type chargesOptions struct {
	guarded  bool                          // the backstop under the guard (backstop.Guarded)
	primary  func(guard.Store) guard.Store // if set, wraps the Redis store
	logger   *slog.Logger                  // the middleware's; default quiet
	store5xx bool                          // httpx.Options.Store5xx
}

// newCharges builds the service on a fresh schema, over rdb under prefix.
func newCharges(t testing.TB, rdb redis.UniversalClient, prefix string, o chargesOptions) *charges {
	t.Helper()
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(context.Background(), db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY, idem_key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := &charges{db: db, b: b, outcomes: map[string]int{}}
	s.rs, s.rdb = guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: prefix}), rdb
	var store guard.Store = s.rs
	if o.primary != nil {
		store = o.primary(store)
	}
	if o.guarded {
		store = backstop.Wrap(store, s.b)
	}
	s.g = guard.New(store, guard.Options{})
	if o.logger == nil {
		o.logger = testenv.Logger(t)
	}
	s.handler = authenticate(httpx.Guard(s.g, httpx.Options{Logger: o.logger, Store5xx: o.store5xx,
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})(http.HandlerFunc(s.charge)))
	return s
}

func (s *charges) charge(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable) // 5xx: the key is released
		return
	}
	defer tx.Rollback()
	lease, _, _ := httpx.ClaimFrom(ctx)
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO charges (idem_key, fence) VALUES ($1, $2) RETURNING id`,
		lease.Key.ID, lease.Fence).Scan(&id); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if s.hook != nil {
		s.hook(r, tx, lease)
	}
	status, body := http.StatusCreated, fmt.Appendf(nil, `{"charge":%d}`, id)
	if s.respond != nil {
		status, body = s.respond(w.Header(), id)
	} else {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/charges/"+strconv.FormatInt(id, 10))
	}
	err = httpx.CommitResponse(w, r, tx, s.b, status, body)
	if s.after != nil {
		s.after(w.Header())
	}
	class := "committed"
	switch {
	case errors.Is(err, backstop.ErrAlreadyCommitted):
		class = "already committed"
	case errors.Is(err, backstop.ErrStaleFence), errors.Is(err, guard.ErrLeaseLost):
		class = "stale"
	case errors.Is(err, guard.ErrUnavailable):
		class = "unavailable"
	case err != nil:
		class = "other: " + err.Error()
	}
	s.mu.Lock()
	s.outcomes[class]++
	s.mu.Unlock()
}

func (s *charges) outcome(class string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcomes[class]
}

func (s *charges) rows(t testing.TB) (rows, keys int) {
	t.Helper()
	if err := s.db.QueryRow(`SELECT count(*), count(DISTINCT idem_key) FROM charges`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	return rows, keys
}

// forget removes key's record from Redis, as a FLUSHALL or a failover would.
func (s *charges) forget(t testing.TB, id string) {
	t.Helper()
	if err := s.rdb.Del(context.Background(), s.rs.Name(s.key(id))).Err(); err != nil {
		t.Fatal(err)
	}
}

// endLease ends the lease of id's holder on its mark in PostgreSQL, as
// when the holder pauses past its lease.
func (s *charges) endLease(t testing.TB, id string) {
	t.Helper()
	k := s.key(id)
	if _, err := s.db.Exec(`UPDATE idemguard_keys SET leased_until = statement_timestamp() WHERE scope = $1 AND id = $2`, k.Scope, k.ID); err != nil {
		t.Fatal(err)
	}
}

// key is the guard key of id for the account "ada" at POST /charges.
func (s *charges) key(id string) guard.Key {
	return guard.Key{Scope: strconv.Quote("ada") + " POST /charges", ID: id}
}

func chargeReq(t *testing.T, c *http.Client, url, id string) reply {
	t.Helper()
	return do(t, c, "POST", url+"/charges", `{"amount":500}`,
		with(key(id), []string{"Authorization", "Bearer tok-ada-1", "Content-Type", "application/json"})...)
}

// sameResponse fails unless replay is first, byte for byte, replayed.
func sameResponse(t *testing.T, what string, first, replay reply) {
	t.Helper()
	if !replay.replayed() || replay.status != first.status || !bytes.Equal(replay.body, first.body) ||
		replay.header.Get("Location") != first.header.Get("Location") ||
		replay.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("%s: %d replayed %v %q Location %q; want %d %q Location %q replayed",
			what, replay.status, replay.replayed(), replay.body, replay.header.Get("Location"),
			first.status, first.body, first.header.Get("Location"))
	}
}

// Recipe "committed": the response is committed with the charge, stored
// in Redis as the same bytes, and after Redis forgets the key it is
// replayed from PostgreSQL byte for byte, with Idempotent-Replayed: true;
// Redis then learns it again.
func TestCommitResponseCommitted(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true})
	srv, c := serve(t, s.handler)
	first := chargeReq(t, c, srv.URL, "ch-1")
	if first.status != http.StatusCreated || first.replayed() || first.header.Get("Location") == "" {
		t.Fatalf("first: %d %v %q", first.status, first.header, first.body)
	}
	rec, err := s.rs.Get(context.Background(), s.key("ch-1"))
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("redis record %+v, %v", rec, err)
	}
	row, _, found, err := s.b.Lookup(context.Background(), s.key("ch-1"))
	if err != nil || !found || !bytes.Equal(row, rec.Result) {
		t.Fatalf("postgres row %q (found %v, %v); redis holds %q: want the same bytes", row, found, err, rec.Result)
	}
	sameResponse(t, "replay from Redis", first, chargeReq(t, c, srv.URL, "ch-1"))

	s.forget(t, "ch-1")
	sameResponse(t, "replay from PostgreSQL", first, chargeReq(t, c, srv.URL, "ch-1"))
	if rec, err := s.rs.Get(context.Background(), s.key("ch-1")); err != nil || !bytes.Equal(rec.Result, row) {
		t.Fatalf("redis after the replay from PostgreSQL: %+v, %v", rec, err)
	}
	if rows, _ := s.rows(t); rows != 1 || s.outcome("committed") != 1 {
		t.Fatalf("charges %d, outcomes %v", rows, s.outcomes)
	}
}

// Recipe "ErrAlreadyCommitted": Redis forgot the key and the guard (not
// consulting the backstop) let the handler run again: its charge is
// rolled back and the stored response answered, status included.
func TestCommitResponseAlreadyCommitted(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{})
	srv, c := serve(t, s.handler)
	first := chargeReq(t, c, srv.URL, "ch-2")
	s.forget(t, "ch-2")
	again := chargeReq(t, c, srv.URL, "ch-2")
	sameResponse(t, "answer after ErrAlreadyCommitted", first, again)
	if s.outcome("already committed") != 1 {
		t.Fatalf("outcomes %v", s.outcomes)
	}
	if rows, _ := s.rows(t); rows != 1 {
		t.Fatalf("%d charges, want 1 (the second rolled back)", rows)
	}
	// Redis stored the answer: the next one replays from it.
	sameResponse(t, "replay from Redis", first, chargeReq(t, c, srv.URL, "ch-2"))
	if s.outcome("already committed") != 1 {
		t.Fatalf("the handler ran again: %v", s.outcomes)
	}
}

// Recipe "ErrStaleFence": A holds the key; Redis forgets it. While A's
// lease lasts, B is told the request is in flight; once it ran out (A
// paused past it), B takes the key (the backstop gives B a higher fence)
// and is still running when A commits: A's charge is rolled back and A
// answers 409 with Retry-After, which is not stored; B commits, and the
// key's answer is B's.
func TestCommitResponseStaleFence(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true})
	srv, c := serve(t, s.handler)
	var n atomic.Int64
	aIn, bIn, aGo, bGo := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	goA, goB := sync.OnceFunc(func() { close(aGo) }), sync.OnceFunc(func() { close(bGo) })
	t.Cleanup(func() { goA(); goB() }) // before the server closes, even if the test fails
	s.hook = func(r *http.Request, tx *sql.Tx, lease guard.Lease) {
		switch n.Add(1) {
		case 1:
			close(aIn)
			<-aGo
		case 2:
			close(bIn)
			<-bGo
		}
	}
	aDone, bDone := make(chan reply, 1), make(chan reply, 1)
	go func() { aDone <- chargeReq(t, c, srv.URL, "ch-3") }()
	<-aIn
	s.forget(t, "ch-3")
	if b := chargeReq(t, c, srv.URL, "ch-3"); b.status != http.StatusConflict || b.problem(t).Type != httpx.ProblemInFlight {
		t.Fatalf("B while A's lease lasts: %d %s", b.status, b.body)
	}
	s.endLease(t, "ch-3") // A pauses past its lease
	go func() { bDone <- chargeReq(t, c, srv.URL, "ch-3") }()
	<-bIn
	goA() // A commits while B runs with a higher fence
	a := <-aDone
	if a.status != http.StatusConflict || a.header.Get("Retry-After") == "" || a.problem(t).Type != httpx.ProblemInFlight {
		t.Fatalf("A: %d Retry-After %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if a.header.Get("Location") != "" {
		t.Fatalf("A's 409 carries the Location of its rolled-back charge: %q", a.header.Get("Location"))
	}
	if rec, err := s.rs.Get(context.Background(), s.key("ch-3")); err != nil || rec.State != guard.StatePending {
		t.Fatalf("after A's 409 the record is %+v, %v; want B's, pending", rec, err)
	}
	goB()
	b := <-bDone
	if b.status != http.StatusCreated || b.replayed() {
		t.Fatalf("B: %d replayed %v", b.status, b.replayed())
	}
	sameResponse(t, "the retry A's client makes", b, chargeReq(t, c, srv.URL, "ch-3"))
	if rows, _ := s.rows(t); rows != 1 || s.outcome("stale") != 1 || s.outcome("committed") != 1 {
		t.Fatalf("charges %d, outcomes %v", rows, s.outcomes)
	}
}

// Recipe "backstop unreachable": the connection under the business
// transaction dies before the commit: 503 with Retry-After, nothing
// stored, the key released; the retry runs the handler and commits once.
// And when PostgreSQL cannot be reached at all, Guarded's claim fails
// closed: 503, the Redis claim released, the handler never runs.
func TestCommitResponseBackstopUnreachable(t *testing.T) {
	// Store5xx keeps 5xx answers: the 503 must still not be stored.
	for _, store5xx := range []bool{false, true} {
		t.Run(fmt.Sprintf("Store5xx=%v", store5xx), func(t *testing.T) { backstopUnreachable(t, store5xx) })
	}
}

func backstopUnreachable(t *testing.T, store5xx bool) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true, store5xx: store5xx})
	srv, c := serve(t, s.handler)
	var n atomic.Int64
	s.hook = func(r *http.Request, tx *sql.Tx, _ guard.Lease) {
		if n.Add(1) == 1 {
			// The server ends this transaction's connection.
			_, _ = tx.ExecContext(r.Context(), `SELECT pg_terminate_backend(pg_backend_pid())`)
		}
	}
	r := chargeReq(t, c, srv.URL, "ch-4")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" || r.problem(t).Type != httpx.ProblemStoreUnavailable {
		t.Fatalf("first: %d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if _, err := s.rs.Get(context.Background(), s.key("ch-4")); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after the 503 the key is %v, want released", err)
	}
	if rows, _ := s.rows(t); rows != 0 {
		t.Fatalf("%d charges after the failed commit", rows)
	}
	r = chargeReq(t, c, srv.URL, "ch-4")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry: %d replayed %v", r.status, r.replayed())
	}
	if rows, _ := s.rows(t); rows != 1 || s.outcome("unavailable") != 1 || s.outcome("committed") != 1 {
		t.Fatalf("charges %d, outcomes %v", rows, s.outcomes)
	}

	// PostgreSQL gone entirely.
	dead, err := sql.Open("postgres", fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?sslmode=disable&connect_timeout=2", testenv.FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	deadBackstop, err := backstop.New(dead, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.g = guard.New(backstop.Wrap(s.rs, deadBackstop), guard.Options{})
	srv2, c2 := serve(t, authenticate(httpx.Guard(s.g, httpx.Options{Logger: testenv.Logger(t),
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})(http.HandlerFunc(s.charge))))
	r = chargeReq(t, c2, srv2.URL, "ch-5")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("without PostgreSQL: %d %s", r.status, r.body)
	}
	if _, err := s.rs.Get(context.Background(), s.key("ch-5")); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("without PostgreSQL the Redis claim stands: %v", err)
	}
	if n.Load() != 2 {
		t.Fatalf("the handler ran %d times, want 2 (not without the backstop)", n.Load())
	}
}

// CommitResponse's rules: a 5xx is not committed (unless Store5xx); a
// response the handler wrote itself cannot be committed after it; writes
// after CommitResponse are refused and header changes not sent; outside a
// guarded run it commits and answers.
func TestCommitResponseRules(t *testing.T) {
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(context.Background(), db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (k text)`); err != nil {
		t.Fatal(err)
	}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, guard.Options{})
	var errs sync.Map
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer tx.Rollback()
		if _, err := tx.Exec(`INSERT INTO effects VALUES ($1)`, r.URL.Path); err != nil {
			t.Error(err)
			return
		}
		var err2 error
		switch r.URL.Path {
		case "/5xx":
			err2 = httpx.CommitResponse(w, r, tx, b, http.StatusBadGateway, []byte("upstream down"))
		case "/429":
			err2 = httpx.CommitResponse(w, r, tx, b, http.StatusTooManyRequests, []byte("slow down"))
		case "/wrote-first":
			w.WriteHeader(http.StatusAccepted)
			err2 = httpx.CommitResponse(w, r, tx, b, http.StatusCreated, []byte("x"))
		case "/plain":
			err2 = httpx.CommitResponse(w, r, tx, b, http.StatusCreated, []byte("plain"))
		case "/sealed":
			err2 = httpx.CommitResponse(w, r, tx, b, http.StatusCreated, []byte("committed"))
			w.Header().Set("X-Late", "1")
			if _, werr := w.Write([]byte(" and more")); werr == nil {
				t.Error("a write after CommitResponse was accepted")
			}
		}
		errs.Store(r.URL.Path, err2)
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{Optional: true}))
	count := func(path string) (n int) {
		t.Helper()
		if err := db.QueryRow(`SELECT count(*) FROM effects WHERE k = $1`, path).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	r := do(t, c, "POST", srv.URL+"/5xx", "a", key("r-5xx")...)
	if r.status != http.StatusBadGateway || string(r.body) != "upstream down" || count("/5xx") != 0 {
		t.Fatalf("5xx: %d %q, %d effects", r.status, r.body, count("/5xx"))
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /5xx", ID: "r-5xx"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("5xx: key %v, want released", err)
	}
	if v, _ := errs.Load("/5xx"); v == nil {
		t.Fatal("5xx: CommitResponse returned nil")
	}

	// A 429 asks for the retry: not committed, released, as a 5xx.
	r = do(t, c, "POST", srv.URL+"/429", "a", key("r-429")...)
	if r.status != http.StatusTooManyRequests || string(r.body) != "slow down" || count("/429") != 0 {
		t.Fatalf("429: %d %q, %d effects", r.status, r.body, count("/429"))
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /429", ID: "r-429"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("429: key %v, want released", err)
	}

	r = do(t, c, "POST", srv.URL+"/wrote-first", "a", key("r-wf")...)
	if v, _ := errs.Load("/wrote-first"); v == nil || count("/wrote-first") != 0 || r.status != http.StatusAccepted {
		t.Fatalf("wrote first: %v, %d effects, status %d", v, count("/wrote-first"), r.status)
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /wrote-first", ID: "r-wf"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("wrote first: key %v, want released (its effect was rolled back)", err)
	}

	r = do(t, c, "POST", srv.URL+"/sealed", "a", key("r-s")...)
	if r.status != http.StatusCreated || string(r.body) != "committed" || r.header.Get("X-Late") != "" || count("/sealed") != 1 {
		t.Fatalf("sealed: %d %q %v, %d effects", r.status, r.body, r.header, count("/sealed"))
	}
	sameResponse(t, "sealed replay", r, do(t, c, "POST", srv.URL+"/sealed", "a", key("r-s")...))

	// No key (Optional): committed and answered, nothing stored.
	r = do(t, c, "POST", srv.URL+"/plain", "a")
	if v, _ := errs.Load("/plain"); r.status != http.StatusCreated || string(r.body) != "plain" || count("/plain") != 1 || v != nil {
		t.Fatalf("unguarded: %d %q, %d effects, %v", r.status, r.body, count("/plain"), v)
	}
}
