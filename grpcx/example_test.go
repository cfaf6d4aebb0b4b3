package grpcx_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// exampleCharge is a Charge method without generated code; with protoc-gen-go-grpc
// it is pb.RegisterPaymentsServer(srv, impl) and the name is
// pb.Payments_Charge_FullMethodName.
const exampleCharge = "/shop.v1.Payments/Charge"

func registerPayments(srv *grpc.Server, charge func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) {
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "shop.v1.Payments",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := &wrapperspb.StringValue{}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return charge(ctx, req.(*wrapperspb.StringValue)) }
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: exampleCharge}, h)
		}}},
	}, struct{}{})
}

// startExample serves charge behind the interceptors on an in-memory
// listener and returns a client connection with the client interceptors.
func startExample(charge func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error),
	server []grpc.UnaryServerInterceptor, client ...grpc.UnaryClientInterceptor) (*grpc.ClientConn, func()) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(server...))
	registerPayments(srv, charge)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///shop",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client...))
	if err != nil {
		panic(err)
	}
	return conn, func() { _ = conn.Close(); srv.Stop() }
}

// The server guards Charge: a repeat of a call with the same
// idempotency-key gets the first call's response, marked replayed, and
// the card is charged once. The store here is in memory; a service with
// several instances uses guard.NewRedisStore.
func ExampleUnaryServerInterceptor() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	charges := 0
	charge := func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		charges++
		lease, _, _ := grpcx.ClaimFrom(ctx) // lease.Fence goes with downstream writes
		return wrapperspb.String(fmt.Sprintf("charged %s (fence %d)", req.GetValue(), lease.Fence)), nil
	}
	guarded := grpcx.UnaryServerInterceptor(g, grpcx.Options{
		Methods:      []string{exampleCharge},
		SingleCaller: true, // or Caller: grpcx.CallerFromContext[...](...) behind your auth interceptor
	})
	conn, stop := startExample(charge, []grpc.UnaryServerInterceptor{guarded})
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-7-payment")
	for range 2 {
		var header metadata.MD
		out := &wrapperspb.StringValue{}
		if err := conn.Invoke(ctx, exampleCharge, wrapperspb.String("€10"), out, grpc.Header(&header)); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%v\n", out.GetValue(), header.Get(grpcx.ReplayedMetadata))
	}
	// Another request under the same key is refused.
	err := conn.Invoke(ctx, exampleCharge, wrapperspb.String("€99"), &wrapperspb.StringValue{})
	fmt.Println(status.Code(err), grpcx.Reason(err))
	fmt.Println("charges:", charges)
	// Output:
	// charged €10 (fence 1) replayed=[]
	// charged €10 (fence 1) replayed=[true]
	// FailedPrecondition IDEMPOTENCY_KEY_REUSED
	// charges: 1
}

// The client interceptor gives each call a UUIDv7 key and retries it with
// that key: here the first attempt's answer is lost (Unavailable), the
// retry is answered from the store, and the card is charged once.
func ExampleUnaryClientInterceptor() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	charges, attempts := 0, 0
	charge := func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		charges++
		return wrapperspb.String("charged " + req.GetValue()), nil
	}
	// Between client and guard, an interceptor that loses the first answer
	// after the charge happened, as a dropped connection would.
	lossy := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		attempts++
		resp, err := h(ctx, req)
		if attempts == 1 {
			return nil, status.Error(codes.Unavailable, "connection reset")
		}
		return resp, err
	}
	guarded := grpcx.UnaryServerInterceptor(g, grpcx.Options{Methods: []string{exampleCharge}, SingleCaller: true})
	conn, stop := startExample(charge, []grpc.UnaryServerInterceptor{lossy, guarded},
		grpcx.UnaryClientInterceptor(grpcx.ClientOptions{}))
	defer stop()

	var key string
	out := &wrapperspb.StringValue{}
	if err := conn.Invoke(context.Background(), exampleCharge, wrapperspb.String("€10"), out, grpcx.SentKey(&key)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.GetValue())
	fmt.Println("attempts:", attempts, "charges:", charges, "key is a UUIDv7:", len(key) == 36 && key[14] == '7')
	// Output:
	// charged €10
	// attempts: 2 charges: 1 key is a UUIDv7: true
}

// KeyFromField takes the key from the request message (AIP-155's
// request_id); with generated code: grpcx.KeyFromField("request_id").
func ExampleKeyFromField() {
	key := grpcx.KeyFromField("value")
	id, err := key(context.Background(), wrapperspb.String("req-0c8f"))
	fmt.Println(id, err)
	id, err = key(context.Background(), wrapperspb.String(""))
	fmt.Printf("%q %v\n", id, err) // no key: InvalidArgument, or unguarded with Options.Optional
	// Output:
	// req-0c8f <nil>
	// "" <nil>
}

type accountKey struct{}

// Keys are kept per caller: an authentication interceptor in front of the
// guard stores who called, and Options.Caller names them by it, never by
// the token (which may be refreshed between two retries).
func ExampleCallerFromContext() {
	caller := grpcx.CallerFromContext(accountKey{}, func(account int64) string { return fmt.Sprint("acct_", account) })
	ctx := context.WithValue(context.Background(), accountKey{}, int64(42))
	fmt.Println(caller(ctx))
	_ = grpcx.Options{Methods: []string{exampleCharge}, Caller: caller}
	// Output:
	// acct_42
}

// A guarded effect that calls another guarded service passes the key of
// its step, the same in every attempt, so the service acts once however
// often the effect runs again.
func ExampleWithIdempotencyKey() {
	lease := guard.Lease{Key: guard.Key{Scope: `"acct_42" /shop.v1.Orders/Place`, ID: "order-7"}}
	ctx := grpcx.WithIdempotencyKey(context.Background(), lease.KeyFor("charge"))
	_ = ctx                              // conn.Invoke(ctx, "/shop.v1.Payments/Charge", ...) through UnaryClientInterceptor
	again := guard.Lease{Key: lease.Key} // another attempt of the same key
	fmt.Println(lease.KeyFor("charge") == again.KeyFor("charge"), len(lease.KeyFor("charge")))
	// Output:
	// true 36
}

// CheckMethods at start-up, after the services are registered: a method
// name with a typo would otherwise run unguarded.
func ExampleCheckMethods() {
	srv := grpc.NewServer()
	registerPayments(srv, func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return req, nil
	})
	fmt.Println(grpcx.CheckMethods(srv, []string{exampleCharge}))
	fmt.Println(grpcx.CheckMethods(srv, []string{"/shop.v1.Payments/Charges"}))
	// Output:
	// <nil>
	// grpcx: 1 of Options.Methods would run unguarded: "/shop.v1.Payments/Charges" is not served (a full name is "/package.Service/Method")
}
