package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// Wrap puts the backstop under a guard on Redis, and Func makes the
// effect and the key's row in one transaction. (Needs a PostgreSQL
// server, so it is compiled, not run.)
func ExampleWrap() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		log.Fatal(err)
	}
	mr, err := miniredis.Run() // any Redis: standalone, Sentinel or Cluster
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	g := guard.New(backstop.Wrap(guard.NewRedisStore(rdb, guard.RedisOptions{}), b), guard.Options{})

	key := guard.Key{Scope: "tenant-1 POST /payments", ID: "order-42"}
	res, err := g.Do(ctx, key, "sha256-of-request", b.Func("sha256-of-request",
		func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount, fence) VALUES ($1, $2, $3)`, "order-42", 1000, l.Fence)
			return []byte(`{"status":"paid"}`), err
		}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
}

// Commit by hand, inside a transaction of your own.
func ExampleBackstop_Commit() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	var lease guard.Lease // from Guard.Claim

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 1`); err != nil {
		log.Fatal(err)
	}
	err = b.Commit(ctx, tx, lease, "fingerprint", []byte("receipt"))
	var done *backstop.AlreadyCommittedError
	switch {
	case errors.As(err, &done):
		fmt.Printf("already done: %s\n", done.Result) // the deferred Rollback undoes the UPDATE
	case err != nil:
		log.Fatal(err) // ErrStaleFence: a later holder took over
	default:
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}
}

// Lookup reads a committed key, e.g. for an operator's inspection.
func ExampleBackstop_Lookup() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	result, fence, found, err := b.Lookup(context.Background(), guard.Key{Scope: "tenant-1", ID: "order-42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(result), fence, found)
}

// New returns the error of options that make no usable table names; the
// zero Options name the default tables. (sql.Open does not connect, so
// this runs without a server.)
func ExampleNew() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := backstop.New(db, pgstore.Options{TablePrefix: "a_prefix_far_too_long_for_postgres_names_"}); err != nil {
		fmt.Println(err)
	}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(b.Options().TablePrefix, b.Options().TTL)
	// Output:
	// pgstore: table prefix "a_prefix_far_too_long_for_postgres_names_" is too long: names would be 71 bytes, PostgreSQL allows 63
	// idemguard_ 24h0m0s
}
