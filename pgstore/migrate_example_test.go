package pgstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/lib/pq"

	"github.com/idemguard/idemguard/pgstore"
)

// NewMigrator lists the migrations without touching the database:
// sql.Open does not connect.
func ExampleNewMigrator() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	m, err := pgstore.NewMigrator(db, pgstore.Options{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	for _, mg := range m.Migrations() {
		fmt.Println(mg.Version, mg.Name)
	}
	// Output:
	// 1 keys
	// 2 consumed_messages
	// 3 webhook_deliveries
	// 4 steps
	// 5 ptok
}

// Migrate at start-up; it is a no-op when the tables are current.
func ExampleMigrate() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pgstore.Migrate(context.Background(), db, pgstore.Options{}); err != nil {
		log.Fatal(err)
	}
}

func ExampleOptions_Validate() {
	fmt.Println(pgstore.Options{}.Validate())
	fmt.Println(pgstore.Options{TablePrefix: "a_prefix_far_too_long_for_postgres_names_"}.Validate())
	// Output:
	// <nil>
	// pgstore: table prefix "a_prefix_far_too_long_for_postgres_names_" is too long: names would be 71 bytes, PostgreSQL allows 63
}

// MigrateDown removes the tables and their rows.
func ExampleMigrateDown() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pgstore.MigrateDown(context.Background(), db, pgstore.Options{}); err != nil {
		log.Fatal(err)
	}
}
