package connectx_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// The procedure; with protoc-gen-connect-go it is
// shopv1connect.PaymentsChargeProcedure, and the handler comes from
// shopv1connect.NewPaymentsHandler(impl, connect.WithInterceptors(...)).
const exampleCharge = "/shop.v1.Payments/Charge"

// The handler guards Charge: a repeat with the same Idempotency-Key gets
// the first response, marked replayed, and the card is charged once. The
// store here is in memory; several instances share guard.NewRedisStore.
func ExampleNewInterceptor() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	charges := 0
	charge := func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		charges++
		return connect.NewResponse(wrapperspb.String("charged " + req.Msg.GetValue())), nil
	}
	guarded := connectx.NewInterceptor(g, connectx.Options{
		Procedures:   []string{exampleCharge},
		SingleCaller: true, // or Caller: connectx.CallerFromContext[...](...) behind your auth interceptor
	})
	mux := http.NewServeMux()
	mux.Handle(exampleCharge, connect.NewUnaryHandler(exampleCharge, charge, connect.WithInterceptors(guarded)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+exampleCharge)
	for range 2 {
		req := connect.NewRequest(wrapperspb.String("€10"))
		req.Header().Set("Idempotency-Key", "order-7-payment")
		res, err := client.CallUnary(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%q\n", res.Msg.GetValue(), res.Header().Get(connectx.ReplayedHeader))
	}
	req := connect.NewRequest(wrapperspb.String("€99"))
	req.Header().Set("Idempotency-Key", "order-7-payment")
	_, err := client.CallUnary(context.Background(), req)
	fmt.Println(connect.CodeOf(err), connectx.Reason(err))
	fmt.Println("charges:", charges)
	// Output:
	// charged €10 replayed=""
	// charged €10 replayed="true"
	// failed_precondition IDEMPOTENCY_KEY_REUSED
	// charges: 1
}

// The client interceptor keys each call and retries it with that key: the
// first attempt's answer is lost after the charge, the retry is answered
// from the store, and the card is charged once.
func ExampleNewClientInterceptor() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	charges, attempts := 0, 0
	charge := func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		charges++
		return connect.NewResponse(wrapperspb.String("charged " + req.Msg.GetValue())), nil
	}
	lossy := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			attempts++
			res, err := next(ctx, req)
			if attempts == 1 {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
			}
			return res, err
		}
	})
	guarded := connectx.NewInterceptor(g, connectx.Options{Procedures: []string{exampleCharge}, SingleCaller: true})
	mux := http.NewServeMux()
	mux.Handle(exampleCharge, connect.NewUnaryHandler(exampleCharge, charge, connect.WithInterceptors(lossy, guarded)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+exampleCharge,
		connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	req := connect.NewRequest(wrapperspb.String("€10"))
	res, err := client.CallUnary(context.Background(), req)
	if err != nil {
		fmt.Println(err)
		return
	}
	key := req.Header().Get("Idempotency-Key")
	fmt.Println(res.Msg.GetValue(), res.Header().Get(connectx.ReplayedHeader))
	fmt.Println("attempts:", attempts, "charges:", charges, "key is a UUIDv7:", len(key) == 36 && key[14] == '7')
	// Output:
	// charged €10 true
	// attempts: 2 charges: 1 key is a UUIDv7: true
}

// KeyFromField takes the key from the request message (AIP-155's
// request_id); with generated code: connectx.KeyFromField("request_id").
func ExampleKeyFromField() {
	key := connectx.KeyFromField("value")
	id, err := key(context.Background(), wrapperspb.String("req-0c8f"))
	fmt.Println(id, err)
	// Output:
	// req-0c8f <nil>
}

type accountKey struct{}

// Keys are kept per caller, named by what the authentication interceptor
// stored, never by the token.
func ExampleCallerFromContext() {
	caller := connectx.CallerFromContext(accountKey{}, func(account int64) string { return fmt.Sprint("acct_", account) })
	fmt.Println(caller(context.WithValue(context.Background(), accountKey{}, int64(42))))
	// Output:
	// acct_42
}

// A step's key, the same in every attempt of the effect, sent to another
// guarded service.
func ExampleWithIdempotencyKey() {
	lease := guard.Lease{Key: guard.Key{Scope: "orders", ID: "order-7"}}
	ctx := connectx.WithIdempotencyKey(context.Background(), lease.KeyFor("charge"))
	_ = ctx // client.CallUnary(ctx, req) through NewClientInterceptor sends it as Idempotency-Key
	fmt.Println(len(lease.KeyFor("charge")))
	// Output:
	// 36
}
