package httpx_test

// The README's httpx snippets, verbatim (TestSnippetsInTests in internal/testenv checks that
// they still are).

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// The README's "HTTP" snippet, run: a repeat with the key is replayed,
// and the client the snippet makes sends a key of its own.
func ExampleGuard_readme() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	mux := http.NewServeMux()
	var charged atomic.Int64
	chargeHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d for %s", charged.Add(1), r.Context().Value(accountKey{}))
	})

	idem := httpx.Guard(g, httpx.Options{
		// Whose keys? The account your authentication middleware put in the context.
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil),
	})
	mux.Handle("POST /charges", authenticate(idem(chargeHandler)))
	client := httpx.NewClient(httpx.TransportOptions{}) // adds a UUIDv7 key to POST/PATCH, retries with it

	srv := httptest.NewServer(mux)
	defer srv.Close()
	post(srv, "/charges", "tok-ada-1", "key-1", `{"amount":500}`)
	post(srv, "/charges", "tok-ada-2", "key-1", `{"amount":500}`) // a refreshed token: the same caller
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
	req.Header.Set("Authorization", "Bearer tok-bob")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", charged.Load())
	// Output:
	// 201 replayed=false charge 1 for ada
	// 201 replayed=true charge 1 for ada
	// 201 false 2
}

// readmeCommitHandler is the README's CommitResponse snippet as a handler;
// TestReadmeCommitResponse runs it.
func readmeCommitHandler(db *sql.DB, bs *backstop.Backstop, body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable) // 5xx: key released
			return
		}
		defer tx.Rollback()
		lease, _, _ := httpx.ClaimFrom(r.Context())
		id, err := insertCharge(r.Context(), tx, lease.Fence)
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", "/charges/"+id)
		// Answers in every outcome (the table below): the error is for your logs.
		if err := httpx.CommitResponse(w, r, tx, bs, http.StatusCreated, body); err != nil {
			log.Printf("charge not committed by this request: %v", err)
		}
	}
}

// insertCharge is the reader's business write, in the handler's transaction.
func insertCharge(ctx context.Context, tx *sql.Tx, fence int64) (string, error) {
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO charges (idem_key, fence) VALUES ('readme', $1) RETURNING id`, fence).Scan(&id)
	return fmt.Sprint(id), err
}

// The README's CommitResponse snippet, run on real Redis and PostgreSQL:
// a repeat is replayed from Redis, and after Redis forgot the key (a guard
// on an empty prefix) from PostgreSQL, byte for byte; the charge is made
// once.
func TestReadmeCommitResponse(t *testing.T) {
	db, _ := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY, idem_key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	bs, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(prefix string) http.Handler {
		store := guardenv.Store(t, guard.RedisOptions{Prefix: testenv.Prefix(t) + prefix})
		g := guard.New(backstop.Wrap(store, bs), guard.Options{})
		return httpx.Guard(g, httpx.Options{SingleCaller: true})(readmeCommitHandler(db, bs, []byte(`{"charged":true}`)))
	}
	send := func(h http.Handler) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	redisA := serve("a:")
	first := send(redisA)
	if first.Code != http.StatusCreated || first.Header().Get("Location") == "" {
		t.Fatalf("first: %d %q", first.Code, first.Header().Get("Location"))
	}
	for name, h := range map[string]http.Handler{"from Redis": redisA, "from PostgreSQL": serve("forgot:")} {
		again := send(h)
		if again.Code != first.Code || again.Header().Get("Location") != first.Header().Get("Location") ||
			again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay %s: %d %q %q %v, want the first 201 replayed", name, again.Code,
				again.Header().Get("Location"), again.Body.String(), again.Header())
		}
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("charges: %d, %v; want 1", n, err)
	}
}
