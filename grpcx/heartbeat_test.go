package grpcx_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A panic after the handler returned (here Options.Release, the user's
// code Finish calls before it ends the claim), which a recovery
// interceptor outside turns into an error: nobody holds the claim any
// more, so its lease must run out, as an abandoned claim's does, not be
// extended by a heartbeat that nothing stops.
func TestPanicAfterHandlerStopsHeartbeat(t *testing.T) {
	const lease = 300 * time.Millisecond
	e := newEnv(t, guard.Options{Lease: lease})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if n == 1 {
			return nil, status.Error(codes.FailedPrecondition, "first")
		}
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{Release: func(c codes.Code) bool {
		if c == codes.FailedPrecondition {
			panic("release")
		}
		return grpcx.DefaultRelease(c)
	}}))
	ctx := context.Background()
	if c := charge(ctx, conn, "r-1", 1); status.Code(c.err) != codes.Internal {
		t.Fatalf("call whose Release panicked: %v, want the recovery's Internal", c.err)
	}
	testenv.WaitFor(t, 20*lease, "the abandoned claim's lease to run out", func() bool {
		return charge(ctx, conn, "r-1", 1).err == nil
	})
}
