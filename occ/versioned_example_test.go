package occ_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/idemguard/idemguard/occ"
)

// RetryOnConflict re-runs a read-and-update until it does not conflict.
func ExampleRetryOnConflict() {
	version := 1 // stands for a row another writer updates twice meanwhile
	tries := 0
	err := occ.RetryOnConflict(context.Background(), occ.RetryOptions{}, func(ctx context.Context) error {
		tries++
		read := version // re-read
		if tries < 3 {
			version++ // the other writer commits first
		}
		if read != version {
			return occ.ErrConflict
		}
		version++
		return nil
	})
	fmt.Println(err, "after", tries, "tries; version", version)
	// Output: <nil> after 3 tries; version 4
}

// Update applies only if the row is still at the version read.
func ExampleVersionedTable_Update() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	accounts := occ.VersionedTable{Name: "accounts"}
	err = occ.RetryOnConflict(ctx, occ.RetryOptions{}, func(ctx context.Context) error {
		var balance, version int64
		if err := db.QueryRowContext(ctx, `SELECT balance, version FROM accounts WHERE id = $1`, 1).Scan(&balance, &version); err != nil {
			return err
		}
		_, err := accounts.Update(ctx, db, 1, version, map[string]any{"balance": balance + 10})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// UpdateRetry re-reads the row before every try.
func ExampleVersionedTable_UpdateRetry() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	counters := occ.VersionedTable{Name: "counters"}
	version, err := counters.UpdateRetry(ctx, db, "visits", occ.RetryOptions{MaxTries: 20},
		func(ctx context.Context) (int64, map[string]any, error) {
			var n, version int64
			err := db.QueryRowContext(ctx, `SELECT n, version FROM counters WHERE id = $1`, "visits").Scan(&n, &version)
			return version, map[string]any{"n": n + 1}, err
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("now at version", version)
}
