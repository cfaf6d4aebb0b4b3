package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A checkout in three steps: reserve stock, charge the card through a
// Stripe-like service that honours Idempotency-Key, create the order. The
// first attempt dies after the charge (the order service is down); the
// retry resumes there: the stock is not reserved again and the card is
// not charged again.
func ExampleStep() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})

	// The payment service: a charge per new Idempotency-Key, the first
	// answer again for a key it has seen.
	var mu sync.Mutex
	charges := map[string]string{}
	stripe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf(`{"id":"ch_%d","amount":500}`, len(charges)+1)
			fmt.Println("payment service: charged 500")
		}
		io.WriteString(w, charges[key])
	}))
	defer stripe.Close()
	payments := httpx.NewClient(httpx.TransportOptions{Base: stripe.Client().Transport})

	type charge struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	orderServiceUp := false
	checkout := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		res, err := guard.Step(ctx, lease, "reserve", func(ctx context.Context) (string, error) {
			fmt.Println("reserving stock")
			return "res_1", nil
		})
		if err != nil {
			return nil, err
		}
		ch, err := guard.Step(ctx, lease, "charge", func(ctx context.Context) (charge, error) {
			// The charge's key is the same in every attempt of this
			// checkout: a charge made by an attempt that died before its
			// result was stored is answered again, not made again.
			ctx = httpx.WithIdempotencyKey(ctx, lease.KeyFor("charge"))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, stripe.URL+"/v1/charges", strings.NewReader("amount=500"))
			resp, err := payments.Do(req)
			if err != nil {
				return charge{}, err
			}
			defer resp.Body.Close()
			var c charge
			return c, json.NewDecoder(resp.Body).Decode(&c)
		})
		if err != nil {
			return nil, err
		}
		order, err := guard.Step(ctx, lease, "order", func(ctx context.Context) (string, error) {
			if !orderServiceUp {
				return "", errors.New("order service unavailable")
			}
			fmt.Println("creating order")
			return "ord_1", nil
		})
		if err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, "%s paid by %s (%s)", order, ch.ID, res), nil
	}

	key := guard.Key{Scope: "shop/POST /checkout", ID: "cart-42"}
	_, err := g.Do(context.Background(), key, "sha256-of-cart", checkout)
	fmt.Println("attempt 1:", err)
	orderServiceUp = true
	result, err := g.Do(context.Background(), key, "sha256-of-cart", checkout)
	fmt.Printf("attempt 2: %s, %v\n", result.Value, err)
	// Output:
	// reserving stock
	// payment service: charged 500
	// attempt 1: order service unavailable
	// creating order
	// attempt 2: ord_1 paid by ch_1 (res_1), <nil>
}

// The key a step passes downstream is a UUID derived from the guard key
// and the step's name: the same in every attempt and every process.
func ExampleLease_KeyFor() {
	key := guard.Key{Scope: "shop/POST /checkout", ID: "cart-42"}
	lease := guard.Lease{Key: key} // inside Guard.Do, the effect's lease
	fmt.Println(lease.KeyFor("charge"))
	fmt.Println(lease.KeyFor("charge") == guard.DownstreamKey(key, "charge"))
	// Output:
	// f08618c0-2a31-8652-82d0-79074bd9cc24
	// true
}

// DownstreamKey needs no lease: a consumer can derive the key of a call
// it makes for a message, from the message's key.
func ExampleDownstreamKey() {
	msg := guard.Key{Scope: "billing-consumers", ID: "msg-0001"}
	k := guard.DownstreamKey(msg, "send-invoice")
	fmt.Println(k, len(k))
	fmt.Println(strings.ReplaceAll(k, "-", "")) // for a service that allows 32 characters
	// Output:
	// e12e1441-ff11-80cb-ba0b-40053569cafd 36
	// e12e1441ff1180cbba0b40053569cafd
}

// CheckStep is the rule every StepStore applies to a step before storing
// it; Step applies it before running one.
func ExampleCheckStep() {
	fmt.Println(guard.CheckStep(0, "charge"))
	fmt.Println(errors.Is(guard.CheckStep(0, ""), guard.ErrInvalidKey))
	fmt.Println(errors.Is(guard.CheckStep(guard.MaxSteps, "one too many"), guard.ErrInvalidKey))
	// Output:
	// <nil>
	// true
	// true
}
