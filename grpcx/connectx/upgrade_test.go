package connectx_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/grpcx/internal/fporacle"
)

// TestFingerprintUpgradeExplicitDefault: a server whose Options name
// DefaultFingerprint compares a mismatch with the previous release's
// fingerprint, as one that leaves it nil does: a retry of a record the
// previous release stored replays. The explicit default refused it as a
// reused key.
func TestFingerprintUpgradeExplicitDefault(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	prev := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Fingerprint: fporacle.Previous})))
	cur := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Fingerprint: connectx.DefaultFingerprint})))
	req := func() *connectRequest {
		r := amountReq(100, "upgrade-explicit")
		// An unknown field (number 1, which the amount's Value knows as
		// an enum, sent as bytes) written after the known one: the
		// previous fingerprint and the field-order one differ.
		v := r.Msg.GetFields()["amount"].ProtoReflect()
		u := protowire.AppendTag(nil, 1, protowire.BytesType)
		v.SetUnknown(protowire.AppendString(u, "x"))
		return r
	}
	if a, _ := fporacle.Previous("", req().Msg); a == mustFingerprint(t, req().Msg) {
		t.Fatal("the request fingerprints as it did before: the test proves nothing")
	}
	first, err := newClient(prev).CallUnary(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	retry, err := newClient(cur).CallUnary(context.Background(), req())
	if err != nil || !replayed(retry.Header()) || !proto.Equal(retry.Msg, first.Msg) {
		t.Fatalf("retry after the upgrade, Fingerprint: connectx.DefaultFingerprint: %v; want the first's response replayed", err)
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

type connectRequest = connect.Request[structpb.Struct]

func mustFingerprint(t testing.TB, m *structpb.Struct) string {
	t.Helper()
	s, err := connectx.DefaultFingerprint(charge, m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
