package pgstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/lib/pq"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// The examples need a PostgreSQL server, so they are compiled, not run.

// New is a guard.Store on PostgreSQL alone.
func ExampleNew() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pgstore.Migrate(context.Background(), db, pgstore.Options{}); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err) // options that make no usable table names
	}
	g := guard.New(store, guard.Options{})
	res, err := g.Do(context.Background(), guard.Key{Scope: "jobs", ID: "nightly-2026-11-29"}, "",
		func(ctx context.Context, l guard.Lease) ([]byte, error) { return []byte("done"), nil })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Value))
}

// Consume handles a message once per consumer group.
func ExampleStore_Consume() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ran, err := s.Consume(context.Background(), "billing", "msg-0001", func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (ref) VALUES ($1)`, "msg-0001")
		return err
	})
	if err != nil {
		log.Fatal(err) // not acknowledged: redelivered later
	}
	fmt.Println("handled now:", ran) // false: a duplicate, acknowledge it
}

// InsertOrRetry queues one pending delivery per (event, ref).
func ExampleStore_InsertOrRetry() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	d, err := s.InsertOrRetry(context.Background(), db, "invoice.paid", "inv_1", []byte(`{"id":"inv_1"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.ID, d.Attempts, d.Inserted)
}

// Purge from a periodic job.
func ExampleStore_Purge() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	n, err := s.Purge(context.Background(), pgstore.PurgeOptions{
		BatchSize: 5000,
		Progress:  func(table string, deleted int64) { log.Printf("purged %d rows from %s", deleted, table) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("purged", n)
}

// MarkConsumed inside a handler's own transaction.
func ExampleStore_MarkConsumed() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	first, err := s.MarkConsumed(ctx, tx, "shipping", "msg-0001")
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
