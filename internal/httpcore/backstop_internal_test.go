package httpcore

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// backstopValues returns what the SQL backstop holds after guarded handlers
// committed responses through CommitResponse (a typical JSON answer, one
// with several header fields and an empty body, a marker for a body over
// the stored maximum), read back with Lookup. Without the services (plain
// go test) it returns nothing; testdata/fuzz holds values from a real run.
func backstopValues(tb testing.TB) [][]byte {
	if os.Getenv(testenv.EnvPostgres) == "" || os.Getenv(testenv.EnvRedis) == "" {
		if os.Getenv(testenv.EnvRequire) == "1" {
			tb.Fatalf("%s and %s are needed for the backstop's seeds", testenv.EnvPostgres, testenv.EnvRedis)
		}
		return nil
	}
	db, _ := testenv.Postgres(tb)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		tb.Fatal(err)
	}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	store := guardenv.Store(tb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(store, b), guard.Options{})
	m := New(g, Config{SingleCaller: true, MaxStoredResponse: 64})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			tb.Error(err)
			return
		}
		defer tx.Rollback()
		var status int
		var body string
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/charges/ch_1")
			status, body = http.StatusCreated, `{"id":"ch_1","amount":500}`
		case "/empty":
			w.Header().Add("Link", "</a>; rel=next")
			w.Header().Add("Link", "</b>; rel=prev")
			w.Header().Set("Set-Cookie", "never=stored")
			status = http.StatusNoContent
		case "/large":
			status, body = http.StatusOK, strings.Repeat("x", 100)
		}
		if err := CommitResponse(w, r.Context(), r.URL.Path, tx, b, status, []byte(body)); err != nil {
			tb.Error(err)
		}
	})
	var out [][]byte
	for _, path := range []string{"/json", "/empty", "/large"} {
		req := httptest.NewRequest(http.MethodPost, path, nil)
		req.Header.Set(DefaultHeader, "fuzz-seed"+path)
		m.ServeHTTP(httptest.NewRecorder(), req, h)
		v, _, found, err := b.Lookup(ctx, guard.Key{Scope: "POST " + path, ID: "fuzz-seed" + path})
		if err != nil || !found {
			tb.Fatalf("%s: committed row %v, %v", path, found, err)
		}
		out = append(out, v)
	}
	if os.Getenv("IDEMGUARD_WRITE_FUZZ_SEEDS") != "" {
		for i, v := range out {
			name := fmt.Sprintf("testdata/fuzz/FuzzDecodeResponse/backstop-%d", i)
			if err := os.WriteFile(name, fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", v), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return out
}
