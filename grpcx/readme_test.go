package grpcx_test

// The README's gRPC snippet, verbatim (TestSnippetsInTests in internal/testenv checks that it
// still is).

import (
	"context"
	"log"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// paymentsServer is what protoc-gen-go-grpc would generate for the
// example's Payments service (wrapperspb messages, see example_test.go).
type paymentsServer interface {
	Charge(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

// pb stands in for the reader's generated package: the two names the
// snippet uses.
var pb = struct {
	Payments_Charge_FullMethodName string
	RegisterPaymentsServer         func(srv *grpc.Server, impl paymentsServer)
}{exampleCharge, func(srv *grpc.Server, impl paymentsServer) { registerPayments(srv, impl.Charge) }}

type readmePayments struct{}

func (readmePayments) Charge(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return wrapperspb.String("charged " + req.GetValue()), nil
}

func readmeGRPC(g *guard.Guard, payments paymentsServer, authenticate grpc.UnaryServerInterceptor,
	target string, creds credentials.TransportCredentials) (*grpc.Server, *grpc.ClientConn) {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		authenticate, // puts the caller in the context
		grpcx.UnaryServerInterceptor(g, grpcx.Options{
			Methods: []string{pb.Payments_Charge_FullMethodName}, // the methods to guard
			Caller:  grpcx.CallerFromContext[string](accountKey{}, nil),
		}),
	))
	pb.RegisterPaymentsServer(srv, payments)
	if err := grpcx.CheckMethods(srv, []string{pb.Payments_Charge_FullMethodName}); err != nil {
		log.Fatal(err) // a misspelled, unregistered or streaming method would run unguarded
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(grpcx.UnaryClientInterceptor(grpcx.ClientOptions{}))) // UUIDv7 key, retries with it
	if err != nil {
		log.Fatal(err)
	}
	return srv, conn
}

// TestReadmeGRPC runs the snippet on loopback: CheckMethods passes, and
// a repeat of a call by the same caller with the same key is replayed
// (the caller is the one the authentication put in the context).
func TestReadmeGRPC(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	authenticate := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("account")) == 1 {
			ctx = context.WithValue(ctx, accountKey{}, md.Get("account")[0])
		}
		return h(ctx, req)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, conn := readmeGRPC(g, readmePayments{}, authenticate, lis.Addr().String(), insecure.NewCredentials())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	defer conn.Close()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "acct_1", "idempotency-key", "order-7")
	for i, want := range []string{"", "true"} {
		var header metadata.MD
		out := &wrapperspb.StringValue{}
		if err := conn.Invoke(ctx, exampleCharge, wrapperspb.String("€10"), out, grpc.Header(&header)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := strings.Join(header.Get(grpcx.ReplayedMetadata), ","); got != want || out.GetValue() != "charged €10" {
			t.Errorf("call %d: %q replayed=%q, want replayed=%q", i, out.GetValue(), got, want)
		}
	}
}
