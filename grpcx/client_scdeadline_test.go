package grpcx_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
)

// TestServiceConfigTimeoutNotRetried: a method's timeout in the
// service config ("timeout" of a methodConfig, gRFC A6) is the caller's
// deadline for the whole call, as a context deadline is: grpc-go applies
// it inside the invoker, so the interceptor's context has none. The
// DeadlineExceeded it gives is not "a deadline of the server's" and must
// not be retried: the call must end at about the configured timeout, not
// MaxAttempts times it.
func TestServiceConfigTimeoutNotRetried(t *testing.T) {
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		<-ctx.Done() // slower than the configured timeout
		return nil, status.FromContextError(ctx.Err()).Err()
	}}
	srv := grpc.NewServer()
	srv.RegisterService(p.desc(), p)
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"`+service+`"}],"timeout":"0.2s"}]}`),
		grpc.WithUnaryInterceptor(fastClient(grpcx.ClientOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); srv.Stop(); <-done })

	start := time.Now()
	c := charge(context.Background(), conn, "", 1) // no deadline of the caller's own: the service config's
	took := time.Since(start)
	if status.Code(c.err) != codes.DeadlineExceeded || p.runs.Load() != 1 {
		t.Fatalf("%v after %d attempts and %s; want DeadlineExceeded after 1 attempt and about 200 ms (the configured timeout)",
			c.err, p.runs.Load(), took.Round(time.Millisecond))
	}
}
