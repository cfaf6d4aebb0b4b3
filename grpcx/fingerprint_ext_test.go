package grpcx_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestFingerprintExtensions: proto2 extensions count, on the request and
// on a message packed in an Any, whether the server has the extension
// linked in or not: two requests differing only in one are different
// requests. And an Any held in an extension is taken in its canonical
// form like any other: the same packed message in another map order is
// the same request.
func TestFingerprintExtensions(t *testing.T) {
	extSchema(t)
	order := func(tip int64) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendString(b, "ord-1")
		b = protowire.AppendTag(b, 100, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(tip))
	}
	packed := func(typ string, v []byte) []byte {
		b, err := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/" + typ, Value: v})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wrapper := func(tip int64) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), packed(fpOrderName, order(tip)))
	}
	decode := func(md protoreflect.MessageDescriptor, b []byte, known bool) proto.Message {
		m := dynamicpb.NewMessage(md)
		o := proto.UnmarshalOptions{}
		if !known {
			o.Resolver = new(protoregistry.Types) // the extensions unknown
		}
		if err := o.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, known := range []bool{true, false} {
		if a, b := mustFingerprint(t, decode(fpextOrder, order(1), known)), mustFingerprint(t, decode(fpextOrder, order(2), known)); a == b {
			t.Errorf("extension known %v: requests with tip 1 and 2 fingerprint the same", known)
		}
		if a, b := mustFingerprint(t, decode(fpextWrapper, wrapper(1), known)), mustFingerprint(t, decode(fpextWrapper, wrapper(2), known)); a == b {
			t.Errorf("extension known %v: Anys packing tips 1 and 2 fingerprint the same", known)
		}
	}
	if m := decode(fpextOrder, order(1), true); !m.ProtoReflect().Has(fpextTip) {
		t.Fatal("the tip was not decoded as an extension")
	}

	// An Any in the extension attachment, packing one Struct in two orders.
	part := func(k string, v any) []byte {
		s, _ := structpb.NewStruct(map[string]any{k: v})
		b, _ := proto.Marshal(s)
		return b
	}
	attached := func(parts ...[]byte) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendString(b, "ord-1")
		b = protowire.AppendTag(b, 101, protowire.BytesType)
		var v []byte
		for _, p := range parts {
			v = append(v, p...)
		}
		return protowire.AppendBytes(b, packed("google.protobuf.Struct", v))
	}
	amount, currency := part("amount", 100.0), part("currency", "eur")
	a := decode(fpextOrder, attached(amount, currency), true)
	if !a.ProtoReflect().Has(fpextAttachment) {
		t.Fatal("the attachment was not decoded as an extension")
	}
	if x, y := mustFingerprint(t, a), mustFingerprint(t, decode(fpextOrder, attached(currency, amount), true)); x != y {
		t.Errorf("an Any in an extension, packed in another map order: %s, then %s; want one fingerprint", x, y)
	}
	if x, y := mustFingerprint(t, a), mustFingerprint(t, decode(fpextOrder, attached(part("amount", 200.0), currency), true)); x == y {
		t.Errorf("an Any in an extension packing another amount fingerprints the same")
	}
}
