package connectx_test

// The README's Connect snippet, verbatim (TestSnippetsInTests in internal/testenv checks that
// it still is), run.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// paymentsHandler is what protoc-gen-connect-go would generate for the
// example's Payments service (wrapperspb messages).
type paymentsHandler interface {
	Charge(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error)
}

// paymentsv1connect stands in for the reader's generated package: the
// three names the snippet uses.
var paymentsv1connect = struct {
	PaymentsChargeProcedure string
	NewPaymentsHandler      func(impl paymentsHandler, opts ...connect.HandlerOption) (string, http.Handler)
	NewPaymentsClient       func(httpClient connect.HTTPClient, url string, opts ...connect.ClientOption) *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]
}{
	PaymentsChargeProcedure: exampleCharge,
	NewPaymentsHandler: func(impl paymentsHandler, opts ...connect.HandlerOption) (string, http.Handler) {
		return exampleCharge, connect.NewUnaryHandler(exampleCharge, impl.Charge, opts...)
	},
	NewPaymentsClient: func(httpClient connect.HTTPClient, url string, opts ...connect.ClientOption) *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue] {
		return connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](httpClient, url+exampleCharge, opts...)
	},
}

type readmePayments struct{ charges int }

func (p *readmePayments) Charge(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
	p.charges++
	return connect.NewResponse(wrapperspb.String("charged " + req.Msg.GetValue())), nil
}

func readmeConnect(g *guard.Guard, impl paymentsHandler, authenticate connect.Interceptor, httpClient connect.HTTPClient, url string) (string, http.Handler, *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]) {
	path, handler := paymentsv1connect.NewPaymentsHandler(impl, connect.WithInterceptors(
		authenticate, // puts the caller in the context: before the guard, which reads it
		connectx.NewInterceptor(g, connectx.Options{
			Procedures: []string{paymentsv1connect.PaymentsChargeProcedure},
			Caller:     connectx.CallerFromContext[string](accountKey{}, nil),
		}),
	))
	client := paymentsv1connect.NewPaymentsClient(httpClient, url,
		connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	return path, handler, client
}

// TestReadmeConnect runs the snippet: a repeat of a call by the same
// caller with the same key is replayed and charges once (the caller is
// the one the authentication interceptor put in the context).
func TestReadmeConnect(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	authenticate := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			return next(context.WithValue(ctx, accountKey{}, req.Header().Get("Account")), req)
		}
	})
	impl := &readmePayments{}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	path, handler, client := readmeConnect(g, impl, authenticate, srv.Client(), srv.URL)
	mux.Handle(path, handler)

	for i, want := range []string{"", "true"} {
		req := connect.NewRequest(wrapperspb.String("€10"))
		req.Header().Set("Account", "acct_1")
		req.Header().Set("Idempotency-Key", "order-7")
		res, err := client.CallUnary(context.Background(), req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := res.Header().Get(connectx.ReplayedHeader); got != want || res.Msg.GetValue() != "charged €10" {
			t.Errorf("call %d: %q replayed=%q, want replayed=%q", i, res.Msg.GetValue(), got, want)
		}
	}
	if impl.charges != 1 {
		t.Errorf("charges: %d, want 1", impl.charges)
	}
}
