package guard_test

// The README's guard snippets, verbatim (TestSnippetsInTests in internal/testenv checks that
// they still are): compiled with the package, so a renamed or removed name
// breaks the build here before it breaks a reader's service.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/memstore"
)

// readmeQuickStart is the README's "Quick start". It is compiled, not run:
// it dials localhost:6379.
func readmeQuickStart(ctx context.Context, idempotencyKey, requestSHA256 string) error {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"}) // standalone, Sentinel or Cluster
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	if err := store.LoadScripts(ctx); err != nil { // once at start-up
		return err
	}
	if err := store.Check(ctx, guard.CheckOptions{}); err != nil { // refuses a Redis that may evict records
		return err
	}
	g := guard.New(store, guard.Options{TTL: 24 * time.Hour, Lease: 30 * time.Second})

	key := guard.Key{Scope: "tenant-42/POST /charges", ID: idempotencyKey}
	res, err := g.Do(ctx, key, requestSHA256, func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		// Runs once per key. ctx is cancelled (cause guard.ErrLeaseLost) before another claim
		// could take the key; pass lease.Fence to downstream writes that must not happen twice.
		return chargeCard(ctx, lease.Fence)
	})
	switch {
	case errors.Is(err, guard.ErrInProgress): // a duplicate is running: retry later (409)
	case errors.Is(err, guard.ErrMismatch): // same key, different request (422)
	case err != nil: // fn's own error (the key may be retried), guard.ErrUnavailable, guard.ErrInvalidKey
		// (an ID over 255 bytes, control characters), ctx's error, or guard.ErrLeaseLost (fn ran, its
		// result was not stored)
	default: // res.Value is the result; res.Replayed says whether it came from the store
	}
	_ = res
	return nil
}

// Compiled, not run (see readmeQuickStart): this keeps the linter from
// calling it unused.
var _ = readmeQuickStart

func chargeCard(ctx context.Context, fence int64) ([]byte, error) { return []byte("charged"), nil }

// The services the README's steps snippet calls, as a reader's would be.
type (
	Reservation struct{ ID string }
	Charge      struct{ ID string }
	Order       struct{ ID string }
	Cart        struct{ Total int64 }
)

type inventoryService struct{}

func (inventoryService) Reserve(ctx context.Context, cart Cart) (Reservation, error) {
	return Reservation{}, nil
}

type stripeService struct{}

func (stripeService) Charge(ctx context.Context, client *http.Client, amount int64) (Charge, error) {
	return Charge{}, nil
}

type orderService struct{}

func (orderService) Create(ctx context.Context, resv Reservation, charge Charge) (Order, error) {
	return Order{}, nil
}

var (
	inventory inventoryService
	stripe    stripeService
	orders    orderService
)

// readmeSteps is the README's "Partial failures: steps and downstream
// keys"; ExampleStep runs the same checkout.
func readmeSteps(ctx context.Context, g *guard.Guard, key guard.Key, requestSHA256 string, cart Cart, paymentsClient *http.Client) (guard.Result, error) {
	res, err := g.Do(ctx, key, requestSHA256, func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		resv, err := guard.Step(ctx, lease, "reserve", func(ctx context.Context) (Reservation, error) {
			return inventory.Reserve(ctx, cart) // not run again once stored
		})
		if err != nil {
			return nil, err
		}
		charge, err := guard.Step(ctx, lease, "charge", func(ctx context.Context) (Charge, error) {
			ctx = httpx.WithIdempotencyKey(ctx, lease.KeyFor("charge")) // Stripe's Idempotency-Key, every attempt
			return stripe.Charge(ctx, paymentsClient, cart.Total)       // paymentsClient := httpx.NewClient(...)
		})
		if err != nil {
			return nil, err
		}
		order, err := guard.Step(ctx, lease, "order", func(ctx context.Context) (Order, error) {
			return orders.Create(ctx, resv, charge)
		})
		if err != nil {
			return nil, err // the attempt fails; the next one resumes after the last stored step
		}
		return json.Marshal(order)
	})
	return res, err
}

// TestReadmeSteps runs the steps snippet on memstore (a StepStore): the
// order comes back, and a repeat is its replay.
func TestReadmeSteps(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	key := guard.Key{Scope: "checkout", ID: "cart-1"}
	for _, replayed := range []bool{false, true} {
		res, err := readmeSteps(context.Background(), g, key, "fp", Cart{Total: 500}, http.DefaultClient)
		if err != nil || string(res.Value) != `{"ID":""}` || res.Replayed != replayed {
			t.Fatalf("Do: %s replayed=%v, %v; want the order, replayed=%v", res.Value, res.Replayed, err, replayed)
		}
	}
}
