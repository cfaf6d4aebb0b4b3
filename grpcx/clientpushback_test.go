package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
)

// TestClientPushbackPastTimeEnds: a grpc-retry-pushback-ms too large for a
// time.Duration (the server asks for centuries: "never") is longer than
// MaxRetryDelay, so it ends the retries at once, as an hour's does; it is
// not read as a delay that overflowed, negative or short, and retried at
// once up to MaxAttempts.
func TestClientPushbackPastTimeEnds(t *testing.T) {
	for _, pushback := range []string{"3600000", "9223372036855", "9223372036854775807", "99999999999999999999"} {
		t.Run(pushback, func(t *testing.T) {
			p := &payments{fn: func(ctx context.Context, _ *structpb.Struct, _ int64) (*structpb.ListValue, error) {
				_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", pushback))
				return nil, status.Error(codes.Unavailable, "shed")
			}}
			conn := serve(t, p, serveOpts{client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{})}})
			if c := charge(context.Background(), conn, "", 1); status.Code(c.err) != codes.Unavailable || p.runs.Load() != 1 {
				t.Fatalf("%v after %d attempts; want Unavailable after 1", c.err, p.runs.Load())
			}
		})
	}
}
