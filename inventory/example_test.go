package inventory_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/memstore"
)

// A service on the standard ServeMux lists its routes as it registers
// them, and its consumer lists itself; the table shows the webhook that
// nothing guards.
func Example() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: 24 * time.Hour}) // your Redis store
	tenant := httpx.TenantFromContext[string](accountKey{}, nil)

	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil)
	mux.Handle("POST /orders", ok, authenticate, httpx.Guard(g, httpx.Options{Tenant: tenant}))
	mux.Handle("POST /payments", ok, authenticate,
		httpx.Guard(g, httpx.Options{Tenant: tenant, CallerScope: inventory.ScopeUser, Key: httpx.KeyFromBody("/payment_id")}))
	mux.Handle("GET /orders/{id}", ok, authenticate)
	mux.Handle("POST /webhooks/psp", ok)

	if _, err := consumerx.Wrap(g, "shipping", func(ctx context.Context, msg consumerx.Message) error { return nil },
		consumerx.Options{Inventory: inv, MessageType: "order.paid"}); err != nil {
		panic(err)
	}

	_ = inv.WriteMarkdown(os.Stdout)
	// Output:
	// | path/handler | method/type | idempotency_required | key_source | dedup_scope | key | ttl | gap |
	// |---|---|---|---|---|---|---|---|
	// | /orders | POST | hard | header | tenant | Idempotency-Key | 24h |  |
	// | /orders/{id} | GET | none | — | — | — | — |  |
	// | /payments | POST | hard | body | user | /payment_id | 24h |  |
	// | /webhooks/psp | POST | none | — | — | — | — | **gap** |
	// | consumer group shipping | order.paid | hard | message_id | global | message id | 24h |  |
	//
	// 1 gap: an unsafe route without an idempotency guard.
}

// The inventory on a debug endpoint: Markdown by default, JSON with
// ?format=json. Serve it where only operators reach it.
func ExampleInventory_Handler() {
	inv := inventory.New(inventory.Options{})
	debug := inventory.NewServeMux(inv, nil)
	debug.Handle("POST /refunds", ok)
	debug.Handle("GET /debug/idempotency", inv.Handler())

	rec := httptest.NewRecorder()
	debug.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/idempotency?format=json", nil))
	fmt.Println(rec.Header().Get("Content-Type"))
	fmt.Print(rec.Body.String())
	// Output:
	// application/json
	// {"entries":[{"kind":"http","handler":"/debug/idempotency","method":"GET","idempotency_required":"none","gap":false,"router":"ServeMux"},{"kind":"http","handler":"/refunds","method":"POST","idempotency_required":"none","gap":true,"router":"ServeMux"}],"gaps":1}
}

var _ http.Handler = (*inventory.ServeMux)(nil)
