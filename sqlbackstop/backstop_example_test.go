package sqlbackstop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/sqlbackstop"
)

// Guarded puts the backstop under a guard on Redis, and Func makes the
// effect and the key's row in one transaction. (Needs a PostgreSQL
// server, so it is compiled, not run.)
func ExampleGuarded() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := sqlbackstop.Migrate(ctx, db, sqlbackstop.Options{}); err != nil {
		log.Fatal(err)
	}
	mr, err := miniredis.Run() // any Redis: standalone, Sentinel or Cluster
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	g := guard.New(sqlbackstop.Guarded(guard.NewRedisStore(rdb, guard.RedisOptions{}), b), guard.Options{})

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
	b := sqlbackstop.New(db, sqlbackstop.Options{})
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
	var done *sqlbackstop.AlreadyCommittedError
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
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	result, fence, found, err := b.Lookup(context.Background(), guard.Key{Scope: "tenant-1", ID: "order-42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(result), fence, found)
}

// NewStore is a guard.Store on PostgreSQL alone.
func ExampleNewStore() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	g := guard.New(sqlbackstop.NewStore(db, sqlbackstop.Options{}), guard.Options{})
	res, err := g.Do(context.Background(), guard.Key{Scope: "jobs", ID: "nightly-2026-11-29"}, "",
		func(ctx context.Context, l guard.Lease) ([]byte, error) { return []byte("done"), nil })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Value))
}

// Consume handles a message once per consumer group.
func ExampleBackstop_Consume() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	ran, err := b.Consume(context.Background(), "billing", "msg-0001", func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (ref) VALUES ($1)`, "msg-0001")
		return err
	})
	if err != nil {
		log.Fatal(err) // not acknowledged: redelivered later
	}
	fmt.Println("handled now:", ran) // false: a duplicate, acknowledge it
}

// InsertOrRetry queues one pending delivery per (event, ref).
func ExampleBackstop_InsertOrRetry() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	d, err := b.InsertOrRetry(context.Background(), db, "invoice.paid", "inv_1", []byte(`{"id":"inv_1"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.ID, d.Attempts, d.Inserted)
}

// Purge from a periodic job.
func ExampleBackstop_Purge() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	n, err := b.Purge(context.Background(), sqlbackstop.PurgeOptions{
		BatchSize: 5000,
		Progress:  func(table string, deleted int64) { log.Printf("purged %d rows from %s", deleted, table) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("purged", n)
}

// MarkConsumed inside a handler's own transaction.
func ExampleBackstop_MarkConsumed() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	first, err := b.MarkConsumed(ctx, tx, "shipping", "msg-0001")
	if err != nil {
		log.Fatal(err)
	}
	if !first {
		return // a duplicate: acknowledge without handling
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, "order-42"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}
