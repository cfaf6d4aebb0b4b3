package fiberx_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// charges is a payments service on Fiber: POST /charges inserts a charge
// and commits it with the response through fiberx.CommitResponse, behind
// fiberx.Guard over the Redis store, wrapped in backstop.Wrap or not.
type charges struct {
	db  *sql.DB
	b   *backstop.Backstop
	rs  *guard.RedisStore
	rdb redis.UniversalClient
	app *fiber.App

	mu       sync.Mutex
	outcomes []error // CommitResponse's answers
}

func newCharges(t *testing.T, wrap bool) *charges {
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
	rdb := testenv.Redis(t)
	s := &charges{db: db, b: b, rdb: rdb, rs: guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)})}
	var store guard.Store = s.rs
	if wrap {
		store = backstop.Wrap(store, b)
	}
	g := guard.New(store, guard.Options{})
	s.app = fiber.New()
	s.app.Post("/charges", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), s.charge)
	return s
}

func (s *charges) charge(c fiber.Ctx) error {
	ctx := c.Context()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return c.SendStatus(http.StatusServiceUnavailable)
	}
	defer func() { _ = tx.Rollback() }()
	lease, _, _ := fiberx.ClaimFrom(c)
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO charges (idem_key, fence) VALUES ($1, $2) RETURNING id`,
		lease.Key.ID, lease.Fence).Scan(&id); err != nil {
		return c.SendStatus(http.StatusServiceUnavailable)
	}
	c.Set("Content-Type", "application/json")
	c.Set("Location", "/charges/"+strconv.FormatInt(id, 10))
	err = fiberx.CommitResponse(c, tx, s.b, http.StatusCreated, fmt.Appendf(nil, `{"charge":%d}`, id))
	s.mu.Lock()
	s.outcomes = append(s.outcomes, err)
	s.mu.Unlock()
	return nil
}

type answer struct {
	status   int
	location string
	body     string
	replayed bool
}

func (s *charges) post(t *testing.T, key string) answer {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpx.DefaultHeader, key)
	res, err := s.app.Test(req, testConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(res.Body)
	return answer{res.StatusCode, res.Header.Get("Location"), body.String(), res.Header.Get(httpx.ReplayedHeader) == "true"}
}

// forget removes key's record from Redis, as a FLUSHALL or a failover would.
func (s *charges) forget(t *testing.T, key string) {
	t.Helper()
	k := guard.Key{Scope: "POST /charges", ID: key}
	if err := s.rdb.Del(context.Background(), s.rs.Name(k)).Err(); err != nil {
		t.Fatal(err)
	}
}

func (s *charges) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func sameAnswer(t *testing.T, what string, first, again answer) {
	t.Helper()
	if !again.replayed || again.status != first.status || again.body != first.body || again.location != first.location {
		t.Fatalf("%s: %+v; want %+v replayed", what, again, first)
	}
}

// TestCommitResponseReplaysFromPostgres: under backstop.Wrap the committed
// response is what Redis stores, byte for byte, and after Redis forgot the
// key it is replayed from PostgreSQL (a row Backstop.Commit wrote with
// other bytes was answered 500 there); the charge is made once.
func TestCommitResponseReplaysFromPostgres(t *testing.T) {
	s := newCharges(t, true)
	first := s.post(t, "ch-1")
	if first.status != http.StatusCreated || first.replayed || first.location == "" {
		t.Fatalf("first: %+v (CommitResponse: %v)", first, s.outcomes)
	}
	k := guard.Key{Scope: "POST /charges", ID: "ch-1"}
	rec, err := s.rs.Get(context.Background(), k)
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("redis record %+v, %v", rec, err)
	}
	row, _, found, err := s.b.Lookup(context.Background(), k)
	if err != nil || !found || !bytes.Equal(row, rec.Result) {
		t.Fatalf("postgres row %q (found %v, %v); redis holds %q: want the same bytes", row, found, err, rec.Result)
	}
	sameAnswer(t, "replay from Redis", first, s.post(t, "ch-1"))
	s.forget(t, "ch-1")
	sameAnswer(t, "replay from PostgreSQL", first, s.post(t, "ch-1"))
	if n := s.rows(t); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestCommitResponseAlreadyCommitted: without backstop.Wrap, Redis forgot
// the key and the handler runs again: its charge is rolled back and the
// committed response answered, which Redis then keeps.
func TestCommitResponseAlreadyCommitted(t *testing.T) {
	s := newCharges(t, false)
	first := s.post(t, "ch-2")
	if first.status != http.StatusCreated {
		t.Fatalf("first: %+v (CommitResponse: %v)", first, s.outcomes)
	}
	s.forget(t, "ch-2")
	sameAnswer(t, "the handler run again", first, s.post(t, "ch-2"))
	if n := s.rows(t); n != 1 {
		t.Fatalf("%d charges, want 1 (the second rolled back)", n)
	}
	if len(s.outcomes) != 2 || s.outcomes[0] != nil || !errors.Is(s.outcomes[1], backstop.ErrAlreadyCommitted) {
		t.Fatalf("CommitResponse answered %v; want nil, then ErrAlreadyCommitted", s.outcomes)
	}
	sameAnswer(t, "replay from Redis", first, s.post(t, "ch-2"))
	if len(s.outcomes) != 2 {
		t.Fatalf("the handler ran again: %v", s.outcomes)
	}
}
