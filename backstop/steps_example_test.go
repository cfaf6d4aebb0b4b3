package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// A checkout whose reservation is a write to the same database: the
// step commits its row with the reservation, so the stock is reserved
// once even when Redis forgets the key and its steps. (Needs a
// PostgreSQL server, so it is compiled, not run.)
func ExampleBackstop_Step() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	g := guard.New(backstop.Wrap(guard.NewRedisStore(rdb, guard.RedisOptions{}), b), guard.Options{})

	key := guard.Key{Scope: "shop/POST /checkout", ID: "cart-42"}
	res, err := g.Do(ctx, key, "sha256-of-cart", func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		reservation, err := b.Step(ctx, lease, "reserve", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO reservations (sku, qty, fence) VALUES ($1, $2, $3) RETURNING id`,
				"tea-42", 1, l.Fence).Scan(&id)
			return fmt.Appendf(nil, "res_%d", id), err
		})
		if err != nil {
			return nil, err
		}
		// ... charge in a step of its own, with lease.KeyFor("charge") ...
		return b.Func("sha256-of-cart", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (reservation, fence) VALUES ($1, $2)`, reservation, l.Fence)
			return append([]byte("order for "), reservation...), err
		})(ctx, lease)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
}

// CommitStep by hand, inside a transaction of your own and a guard.Step.
func ExampleBackstop_CommitStep() {
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
	var lease guard.Lease // the effect's, from Guard.Do

	v, err := guard.Step(ctx, lease, "debit", func(ctx context.Context) ([]byte, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 1`); err != nil {
			return nil, err
		}
		err = b.CommitStep(ctx, tx, lease, "debit", []byte("debited 10"))
		var done *backstop.AlreadyCommittedError
		if errors.As(err, &done) {
			return done.Result, nil // committed by an earlier attempt: the Rollback undoes this one
		}
		if err != nil {
			return nil, err // ErrStaleFence: a later holder took over
		}
		return []byte("debited 10"), tx.Commit()
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))
}

// LookupStep reads a committed step, e.g. for an operator's inspection.
func ExampleBackstop_LookupStep() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	result, fence, found, err := b.LookupStep(context.Background(), guard.Key{Scope: "shop/POST /checkout", ID: "cart-42"}, "reserve")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(result), fence, found)
}
