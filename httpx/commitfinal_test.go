package httpx_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that panics after CommitResponse committed its charge (a
// deferred metric, a log call) must not tell the client its request
// failed: the money moved. The client gets the committed response, Redis
// stores its bytes, and a retry replays it; not a 500 "retry with the
// same key" that a client may take for a failed payment and pay again
// under a new key.
func TestCommitResponseThenPanic(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{})
	srv, c := serve(t, s.handler)
	s.after = func(http.Header) { panic("metrics: nil map") }

	first := chargeReq(t, c, srv.URL, "ch-panic")
	if first.status != http.StatusCreated || first.replayed() || first.header.Get("Location") == "" {
		t.Fatalf("first: %d %q Location %q; want the committed 201", first.status, first.body, first.header.Get("Location"))
	}
	rec, err := s.rs.Get(context.Background(), s.key("ch-panic"))
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("redis record %+v, %v; want completed", rec, err)
	}
	row, _, found, err := s.b.Lookup(context.Background(), s.key("ch-panic"))
	if err != nil || !found || !bytes.Equal(row, rec.Result) {
		t.Fatalf("postgres row %q (found %v, %v); redis holds %q: want the same bytes", row, found, err, rec.Result)
	}
	sameResponse(t, "replay", first, chargeReq(t, c, srv.URL, "ch-panic"))
	if rows, _ := s.rows(t); rows != 1 {
		t.Fatalf("%d charges, want 1", rows)
	}
}

// The same with http.ErrAbortHandler: the connection is cut, as the
// handler asked, but the committed response is stored, so the retry
// replays it.
func TestCommitResponseThenAbort(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{})
	srv, c := serve(t, s.handler)
	s.after = func(http.Header) { panic(http.ErrAbortHandler) }

	req, err := http.NewRequest("POST", srv.URL+"/charges", bytes.NewReader([]byte(`{"amount":500}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "ch-abort")
	req.Header.Set("Authorization", "Bearer tok-ada-1")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("aborted handler answered %d", resp.StatusCode)
	}
	rec, err := s.rs.Get(context.Background(), s.key("ch-abort"))
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("redis record %+v, %v; want completed with the committed response", rec, err)
	}
	s.after = nil
	again := chargeReq(t, c, srv.URL, "ch-abort")
	if again.status != http.StatusCreated || !again.replayed() {
		t.Fatalf("retry: %d replayed %v %q", again.status, again.replayed(), again.body)
	}
	if rows, _ := s.rows(t); rows != 1 {
		t.Fatalf("%d charges, want 1", rows)
	}
}

// A second CommitResponse after one that committed (a helper that commits
// again on its own path) is refused and rolls its transaction back, but it
// does not undo the first: the committed response stays the key's answer,
// stored in Redis, not released for the handler to run again.
func TestCommitResponseTwice(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{})
	second := make(chan error, 1)
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := s.db.BeginTx(r.Context(), nil)
		if err != nil {
			t.Error(err)
			return
		}
		lease, _, _ := httpx.ClaimFrom(r.Context())
		if _, err := tx.Exec(`INSERT INTO charges (idem_key, fence) VALUES ($1, $2)`, lease.Key.ID, lease.Fence); err != nil {
			t.Error(err)
		}
		if err := httpx.CommitResponse(w, r, tx, s.b, http.StatusCreated, []byte(`{"charge":1}`)); err != nil {
			t.Error(err)
		}
		again, err := s.db.BeginTx(r.Context(), nil)
		if err != nil {
			t.Error(err)
			return
		}
		second <- httpx.CommitResponse(w, r, again, s.b, http.StatusCreated, []byte(`{"charge":1}`))
	})
	srv, c := serve(t, authenticate(httpx.Guard(s.g, httpx.Options{Logger: testenv.Logger(t),
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})(charge)))

	first := chargeReq(t, c, srv.URL, "ch-twice")
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	if err := <-second; err == nil {
		t.Fatal("the second CommitResponse returned nil")
	}
	rec, err := s.rs.Get(context.Background(), s.key("ch-twice"))
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("redis record %+v, %v; want completed with the first commit's response", rec, err)
	}
	sameResponse(t, "replay", first, chargeReq(t, c, srv.URL, "ch-twice"))
	if rows, _ := s.rows(t); rows != 1 {
		t.Fatalf("%d charges, want 1", rows)
	}
}

// The same with runtime.Goexit (a t.FailNow in a handler): the committed
// response is stored, so the retry replays it, but it is not sent: the
// handler's goroutine goes on exiting and net/http closes the connection
// without a response (a flush then would send a cut-off one). The log
// record says what became of it, not that it was sent.
func TestCommitResponseThenGoexit(t *testing.T) {
	var logs syncBuffer
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	srv, c := serve(t, s.handler)
	s.after = func(http.Header) { runtime.Goexit() }

	req, err := http.NewRequest("POST", srv.URL+"/charges", bytes.NewReader([]byte(`{"amount":500}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "ch-goexit")
	req.Header.Set("Authorization", "Bearer tok-ada-1")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a handler gone with runtime.Goexit answered %d", resp.StatusCode)
	}
	s.after = nil
	again := chargeReq(t, c, srv.URL, "ch-goexit")
	if again.status != http.StatusCreated || !again.replayed() {
		t.Fatalf("retry: %d replayed %v %q", again.status, again.replayed(), again.body)
	}
	if rows, _ := s.rows(t); rows != 1 {
		t.Fatalf("%d charges, want 1", rows)
	}
	var msgs []string
	for _, rec := range logs.records(t) {
		msgs = append(msgs, rec["msg"].(string))
	}
	if len(msgs) != 1 || !strings.Contains(msgs[0], "runtime.Goexit") || strings.Contains(msgs[0], "sent") {
		t.Fatalf("log messages %q; want one saying the handler exited with runtime.Goexit, not that the response was sent", msgs)
	}
}

// A business transaction whose COMMIT PostgreSQL refuses for good (a
// deferred unique constraint, checked at COMMIT) rolled back: nothing was
// charged, the key is released, and the client is told 500, not 503
// "retry later" (which it was, as for a connection lost at COMMIT: every
// retry ran the handler again into the same refusal).
func TestCommitRefusedAtCommitIs500(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{})
	if _, err := s.db.Exec(`CREATE TABLE refs (ref text, CONSTRAINT refs_u UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO refs VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	s.hook = func(r *http.Request, tx *sql.Tx, _ guard.Lease) {
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO refs VALUES ('taken')`); err != nil { // refused at COMMIT
			t.Error(err)
		}
	}
	srv, c := serve(t, s.handler)
	for i := range 2 {
		r := chargeReq(t, c, srv.URL, "ch-refused")
		if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemStoreError {
			t.Fatalf("try %d: %d %q; want 500 %s", i+1, r.status, r.body, httpx.ProblemStoreError)
		}
	}
	if rows, _ := s.rows(t); rows != 0 {
		t.Fatalf("%d charges, want 0 (rolled back)", rows)
	}
}
