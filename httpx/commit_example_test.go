package httpx_test

import (
	"database/sql"
	"fmt"
	"log"
	"net/http"

	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/pgstore"
)

// A charge endpoint whose effect and response are committed together: a
// replay after Redis forgot the key comes from PostgreSQL, byte for byte.
// (Needs Redis and PostgreSQL, so it is compiled, not run.)
func ExampleCommitResponse() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	bs, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	g := guard.New(backstop.Wrap(guard.NewRedisStore(rdb, guard.RedisOptions{}), bs), guard.Options{})

	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable) // 5xx: the key is released, the retry runs again
			return
		}
		defer tx.Rollback()
		lease, _, _ := httpx.ClaimFrom(r.Context())
		var id int64
		if err := tx.QueryRowContext(r.Context(),
			`INSERT INTO charges (amount, fence) VALUES (500, $1) RETURNING id`, lease.Fence).Scan(&id); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		// Commits the charge with the response, and answers with it; on
		// ErrAlreadyCommitted it answers the stored response instead, on
		// ErrStaleFence 409, with the backstop unreachable 503.
		if err := httpx.CommitResponse(w, r, tx, bs, http.StatusCreated, fmt.Appendf(nil, `{"charge":%d}`, id)); err != nil {
			log.Printf("charge not committed here: %v", err)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", authenticate(httpx.Guard(g, httpx.Options{
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil),
	})(charge)))
	log.Fatal(http.ListenAndServe("localhost:8080", mux))
}
