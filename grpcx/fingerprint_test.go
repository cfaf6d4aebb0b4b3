package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestFingerprintAnyContents: a request carrying a google.protobuf.Any is
// the same request whatever order the client encoded the packed message's
// fields in. Go's protobuf encodes a map in a random order unless told to
// be deterministic, and anypb.New is not, so a client that builds the same
// request again for its retry (after a restart, from its own records) can
// pack other bytes. The retry must be replayed, not refused as a reused
// key (which tells the client to send its charge again under a new key);
// a packed message with another amount is still refused.
func TestFingerprintAnyContents(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	desc := p.desc()
	desc.Methods = append(desc.Methods, method("ChargeAny", func() *anypb.Any { return &anypb.Any{} },
		func(ctx context.Context, req *anypb.Any) (*structpb.ListValue, error) {
			s := &structpb.Struct{}
			if err := req.UnmarshalTo(s); err != nil {
				return nil, err
			}
			return p.charge(ctx, s)
		}))
	const chargeAny = "/" + service + "/ChargeAny"
	conn := serveWith(t, p, guarded(e, grpcx.Options{Methods: []string{chargeAny}}), desc)
	ctx := context.Background()

	// One Struct, its two map entries encoded in either order (a message
	// encoded in parts is the concatenation of the parts).
	part := func(k string, v any) []byte {
		s, err := structpb.NewStruct(map[string]any{k: v})
		if err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	packed := func(parts ...[]byte) *anypb.Any {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.Struct", Value: b}
	}
	amount, currency := part("amount", 100.0), part("currency", "eur")

	first := invoke(ctx, conn, chargeAny, "any-1", packed(amount, currency))
	if first.err != nil {
		t.Fatal(first.err)
	}
	retry := invoke(ctx, conn, chargeAny, "any-1", packed(currency, amount))
	if retry.err != nil || !retry.replayed() || !proto.Equal(retry.resp, first.resp) {
		t.Fatalf("retry of the same request, packed in another order: %v (replayed %v); want the first's response replayed", retry.err, retry.replayed())
	}
	other := invoke(ctx, conn, chargeAny, "any-1", packed(part("amount", 200.0), currency))
	if code, reason, _, _ := statusOf(t, other.err); code != codes.FailedPrecondition || reason != grpcx.ReasonKeyReused {
		t.Fatalf("another amount under the key: %v, want FailedPrecondition %s", other.err, grpcx.ReasonKeyReused)
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
