package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestStoredStatusInvalidUTF8: a handler's stored (non-released)
// error status whose message is not valid UTF-8 (an error text cut
// mid-rune, raw bytes of an id) is replayed as that error: it was stored
// as bytes that do not decode (google.rpc.Status.message is a proto3
// string), and every replay answered Internal, "stored status cannot be
// read", for the whole TTL (found by review).
func TestStoredStatusInvalidUTF8(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		return nil, status.Error(codes.NotFound, "no account named caf\xc3") // a UTF-8 rune cut in two
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	first := charge(ctx, conn, "utf8-1", 1)
	if status.Code(first.err) != codes.NotFound {
		t.Fatalf("first call: %v, want NotFound", first.err)
	}
	second := charge(ctx, conn, "utf8-1", 1)
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", p.runs.Load())
	}
	if status.Code(second.err) != codes.NotFound {
		t.Fatalf("replay of a NotFound call: err %v (replayed %v, response %v); want NotFound",
			second.err, second.replayed(), second.resp)
	}
}
