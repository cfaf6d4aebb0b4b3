package fiberx_test

import (
	"database/sql"
	"fmt"
	"log"
	"net/http"

	"github.com/gofiber/fiber/v3"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// A charge committed with its response: replays come from Redis, and from
// PostgreSQL after Redis forgot the key (backstop.Wrap), byte for byte.
func ExampleCommitResponse() {
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable") // a driver: lib/pq or pgx's stdlib
	if err != nil {
		log.Fatal(err)
	}
	bs, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	g := guard.New(backstop.Wrap(guard.NewRedisStore(rdb, guard.RedisOptions{}), bs), guard.Options{})

	app := fiber.New()
	app.Post("/charges", fiberx.Guard(g, fiberx.Options{
		Tenant: func(c fiber.Ctx) string { s, _ := c.Locals("account").(string); return s },
	}), func(c fiber.Ctx) error {
		tx, err := db.BeginTx(c.Context(), nil)
		if err != nil {
			return c.SendStatus(http.StatusServiceUnavailable) // 5xx: the key is released, the retry runs again
		}
		defer tx.Rollback()
		lease, _, _ := fiberx.ClaimFrom(c)
		var id int64
		if err := tx.QueryRowContext(c.Context(),
			`INSERT INTO charges (amount, fence) VALUES (500, $1) RETURNING id`, lease.Fence).Scan(&id); err != nil {
			return err
		}
		c.Set("Content-Type", "application/json")
		c.Set("Location", fmt.Sprintf("/charges/%d", id))
		// Commits the charge with the response, and answers with it; on
		// ErrAlreadyCommitted it answers the stored response instead, on
		// ErrStaleFence 409, with the backstop unreachable 503.
		if err := fiberx.CommitResponse(c, tx, bs, http.StatusCreated, fmt.Appendf(nil, `{"charge":%d}`, id)); err != nil {
			log.Printf("charge not committed here: %v", err)
		}
		return nil
	})
	log.Fatal(app.Listen("localhost:8080"))
}
