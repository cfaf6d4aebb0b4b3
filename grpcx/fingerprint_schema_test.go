package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/grpcx/internal/fporacle"
	"github.com/idemguard/idemguard/guard"
)

// chargeService serves fptest's Charge as a server with schema md does:
// the requests it decodes hold what md does not know as unknown fields.
func chargeService(p *payments, md protoreflect.MessageDescriptor) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{ServiceName: service, HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{
		method("ChargeV", func() *dynamicpb.Message { return dynamicpb.NewMessage(md) },
			func(context.Context, *dynamicpb.Message) (*structpb.ListValue, error) {
				return structpb.NewList([]any{float64(p.runs.Add(1))})
			}),
	}}
}

const chargeV = "/" + service + "/ChargeV"

// clientBytes is m as a client with generated code sends it: its fields,
// at every depth, in number order (dynamicpb, unless told to be
// deterministic, writes them in the order of a Go map).
func clientBytes(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// clientCodec sends requests as clientBytes does.
type clientCodec struct{}

func (clientCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (clientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (clientCodec) Name() string { return "proto" }

var asClient = grpc.ForceCodecV2(clientCodec{})

// TestFingerprintRollingDeploy: during a rolling deploy a client on the
// new .proto sends fields the old servers do not know; an old server
// holds them as unknown fields, a new one decodes them. A retry that
// lands on the other kind of server is the same request and is replayed,
// both ways; a request that differs in a field only the new schema knows
// is refused on either kind.
func TestFingerprintRollingDeploy(t *testing.T) {
	e := newEnv(t, guard.Options{})
	oldMD, newMD := chargeSchemas(t)
	p := &payments{}
	opts := grpcx.Options{Methods: []string{chargeV}}
	old := serveWith(t, p, guarded(e, opts), chargeService(p, oldMD))
	cur := serveWith(t, p, guarded(e, opts), chargeService(p, newMD))
	ctx := context.Background()
	req, other := newCharge(t, newMD, "rent"), newCharge(t, newMD, "deposit")

	for _, c := range []struct {
		key          string
		first, retry *grpc.ClientConn
	}{{"roll-old-new", old, cur}, {"roll-new-old", cur, old}} {
		first := invoke(ctx, c.first, chargeV, c.key, req, asClient)
		if first.err != nil {
			t.Fatal(first.err)
		}
		retry := invoke(ctx, c.retry, chargeV, c.key, req, asClient)
		if retry.err != nil || !retry.replayed() || !proto.Equal(retry.resp, first.resp) {
			t.Fatalf("%s: retry on the other server: %v (replayed %v); want the first's response replayed", c.key, retry.err, retry.replayed())
		}
		for _, conn := range []*grpc.ClientConn{old, cur} {
			got := invoke(ctx, conn, chargeV, c.key, other, asClient)
			if code, reason, _, _ := statusOf(t, got.err); code != codes.FailedPrecondition || reason != grpcx.ReasonKeyReused {
				t.Fatalf("%s: another memo under the key: %v, want FailedPrecondition %s", c.key, got.err, grpcx.ReasonKeyReused)
			}
		}
	}
	if n := p.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once per key)", n)
	}
}

// TestFingerprintSchemaIndependent: the same bytes fingerprint the same
// whichever schema decoded them (known fields, unknown ones, fields
// unknown inside a known sub-message), and bytes that differ in any field,
// known or not, fingerprint differently.
func TestFingerprintSchemaIndependent(t *testing.T) {
	oldMD, newMD := chargeSchemas(t)
	fp := func(m proto.Message) string {
		t.Helper()
		s, err := grpcx.DefaultFingerprint(chargeV, m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	seen := map[string]string{}
	for _, memo := range []string{"rent", "deposit"} {
		b := clientBytes(t, newCharge(t, newMD, memo))
		o, n := fp(decodeAs(t, oldMD, b)), fp(decodeAs(t, newMD, b))
		if o != n {
			t.Errorf("memo %q: old schema %s, new schema %s; want one fingerprint", memo, o, n)
		}
		if prev, ok := seen[o]; ok {
			t.Errorf("memos %q and %q fingerprint the same", prev, memo)
		}
		seen[o] = memo
	}
}

// TestFingerprintUpgrade: a request encoded in field order fingerprints as
// the previous release did; a record stored by the previous release, whose
// fingerprint was computed otherwise for this request (an old server with
// unknown fields before known ones), still replays on this release, and
// another request under its key is still refused.
func TestFingerprintUpgrade(t *testing.T) {
	e := newEnv(t, guard.Options{})
	oldMD, newMD := chargeSchemas(t)
	p := &payments{}
	prev := serveWith(t, p, guarded(e, grpcx.Options{Methods: []string{chargeV}, Fingerprint: fporacle.Previous}), chargeService(p, oldMD))
	cur := serveWith(t, p, guarded(e, grpcx.Options{Methods: []string{chargeV}}), chargeService(p, oldMD))
	ctx := context.Background()
	req := newCharge(t, newMD, "rent")

	// A request in field order (the common case) fingerprints as before:
	// its old records match at the first claim.
	for _, m := range []proto.Message{amountReq(100), decodeAs(t, newMD, clientBytes(t, req))} {
		if was, _ := fporacle.Previous("", m); was != mustFingerprint(t, m) {
			t.Errorf("%v: fingerprint changed: %s, was %s", m, mustFingerprint(t, m), was)
		}
	}
	b := clientBytes(t, req)
	if was, _ := fporacle.Previous("", decodeAs(t, oldMD, b)); was == mustFingerprint(t, decodeAs(t, oldMD, b)) {
		t.Fatal("the test's request fingerprints as it did before: it proves nothing")
	}
	first := invoke(ctx, prev, chargeV, "upgrade-1", req, asClient)
	if first.err != nil {
		t.Fatal(first.err)
	}
	retry := invoke(ctx, cur, chargeV, "upgrade-1", req, asClient)
	if retry.err != nil || !retry.replayed() || !proto.Equal(retry.resp, first.resp) {
		t.Fatalf("retry after the upgrade: %v (replayed %v); want the first's response replayed", retry.err, retry.replayed())
	}
	other := invoke(ctx, cur, chargeV, "upgrade-1", newCharge(t, newMD, "deposit"), asClient)
	if code, reason, _, _ := statusOf(t, other.err); code != codes.FailedPrecondition || reason != grpcx.ReasonKeyReused {
		t.Fatalf("another memo under the key: %v, want FailedPrecondition %s", other.err, grpcx.ReasonKeyReused)
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func mustFingerprint(t testing.TB, m proto.Message) string {
	t.Helper()
	s, err := grpcx.DefaultFingerprint(chargeV, m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFingerprintUpgradeExplicitDefault: a server that names
// DefaultFingerprint in its Options (as code that spells out its defaults
// does) gets DefaultFingerprint's comparison with the previous release's
// fingerprint too: a retry of a record stored before the upgrade replays.
// Only a nil Fingerprint got it; the explicit default refused the retry as
// a reused key.
func TestFingerprintUpgradeExplicitDefault(t *testing.T) {
	e := newEnv(t, guard.Options{})
	oldMD, newMD := chargeSchemas(t)
	p := &payments{}
	prev := serveWith(t, p, guarded(e, grpcx.Options{Methods: []string{chargeV}, Fingerprint: fporacle.Previous}), chargeService(p, oldMD))
	cur := serveWith(t, p, guarded(e, grpcx.Options{Methods: []string{chargeV}, Fingerprint: grpcx.DefaultFingerprint}), chargeService(p, oldMD))
	ctx := context.Background()
	req := newCharge(t, newMD, "rent")
	first := invoke(ctx, prev, chargeV, "upgrade-explicit", req, asClient)
	if first.err != nil {
		t.Fatal(first.err)
	}
	retry := invoke(ctx, cur, chargeV, "upgrade-explicit", req, asClient)
	if retry.err != nil || !retry.replayed() || !proto.Equal(retry.resp, first.resp) {
		t.Fatalf("retry after the upgrade, Fingerprint: grpcx.DefaultFingerprint: %v (replayed %v); want the first's response replayed", retry.err, retry.replayed())
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
