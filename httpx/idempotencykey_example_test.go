package httpx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A step of a guarded effect calls a payment service (itself behind
// httpx.Guard) with the key of the step. The first attempt never hears
// the answer; the second sends the same key, and the service answers
// with the charge it made instead of charging again.
func ExampleWithIdempotencyKey() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var charges atomic.Int64
	payments := httptest.NewServer(httpx.Guard(g, httpx.Options{SingleCaller: true})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "charge %d", charges.Add(1))
		})))
	defer payments.Close()
	client := httpx.NewClient(httpx.TransportOptions{Base: payments.Client().Transport})

	lost := true // the first attempt's answer is lost on the way back
	checkout := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		return guard.Step(ctx, lease, "charge", func(ctx context.Context) ([]byte, error) {
			ctx = httpx.WithIdempotencyKey(ctx, lease.KeyFor("charge"))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, payments.URL+"/charges", strings.NewReader(`{"amount":500}`))
			resp, err := client.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if lost {
				lost = false
				return nil, errors.New("connection reset")
			}
			return body, err
		})
	}
	key := guard.Key{Scope: "shop/POST /checkout", ID: "cart-7"}
	_, err := g.Do(context.Background(), key, "fp", checkout)
	fmt.Println("attempt 1:", err)
	res, err := g.Do(context.Background(), key, "fp", checkout)
	fmt.Printf("attempt 2: %s, %v\n", res.Value, err)
	fmt.Println("charges made:", charges.Load())
	// Output:
	// attempt 1: connection reset
	// attempt 2: charge 1, <nil>
	// charges made: 1
}
