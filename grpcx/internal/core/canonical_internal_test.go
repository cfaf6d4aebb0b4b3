package core

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// TestSortFields: fields in number order at every known depth (a group
// included), stably (a repeated field's elements keep their order), and
// nothing looked into that the schema does not call a message: neither a
// bytes field nor an unknown field, whose bytes would parse as one.
//
//	syntax = "proto2";
//	message G {
//	  optional group Grp = 1 { optional int32 a = 2; optional int32 b = 3; }
//	  optional bytes raw = 6;
//	  repeated int32 r = 4;
//	  optional G child = 7;
//	}
func TestSortFields(t *testing.T) {
	md := sortFieldsSchema(t)
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	group := func(num protowire.Number, parts ...[]byte) []byte {
		b := protowire.AppendTag(nil, num, protowire.StartGroupType)
		b = append(b, bytes.Join(parts, nil)...)
		return protowire.AppendTag(b, num, protowire.EndGroupType)
	}
	lenField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	unsorted := append(varint(3, 1), varint(2, 1)...) // would parse as a message: must stay so
	in := bytes.Join([][]byte{
		varint(4, 30), lenField(9, unsorted), group(1, varint(3, 7), varint(2, 8)), varint(4, 10),
		lenField(6, unsorted), varint(5, 1), varint(4, 20),
	}, nil)
	want := bytes.Join([][]byte{
		group(1, varint(2, 8), varint(3, 7)), varint(4, 30), varint(4, 10), varint(4, 20),
		varint(5, 1), lenField(6, unsorted), lenField(9, unsorted),
	}, nil)
	got := bytes.Clone(in)
	sortFields(got, md)
	if !bytes.Equal(got, want) {
		t.Fatalf("sortFields:\n got %x\nwant %x", got, want)
	}
	// A level it cannot read to its end keeps its order.
	trunc := in[:len(in)-1]
	got = bytes.Clone(trunc)
	sortFields(got, md)
	if len(got) != len(trunc) || !bytes.HasPrefix(got, varint(4, 30)) || !bytes.HasSuffix(got, trunc[len(trunc)-8:]) {
		t.Fatalf("sortFields reordered a level it cannot read: %x, was %x", got, trunc)
	}
}

// sortFieldsSchema is TestSortFields's message G.
func sortFieldsSchema(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	i32 := descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum()
	f, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("sortfields.proto"), Package: proto.String("p"), Syntax: proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("G"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("grp"), Number: proto.Int32(1), Label: opt, Type: descriptorpb.FieldDescriptorProto_TYPE_GROUP.Enum(), TypeName: proto.String(".p.G.Grp")},
				{Name: proto.String("raw"), Number: proto.Int32(6), Label: opt, Type: descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()},
				{Name: proto.String("r"), Number: proto.Int32(4), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(), Type: i32},
				{Name: proto.String("child"), Number: proto.Int32(7), Label: opt, Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".p.G")},
			},
			NestedType: []*descriptorpb.DescriptorProto{{Name: proto.String("Grp"), Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("a"), Number: proto.Int32(2), Label: opt, Type: i32},
				{Name: proto.String("b"), Number: proto.Int32(3), Label: opt, Type: i32},
			}}},
		}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return f.Messages().ByName("G")
}

// TestSortFieldsAsBefore: sortFields, written once into a new buffer,
// gives the bytes the in-place sort of the release before gave
// (previousSortFields, kept here as the oracle), on random encodings of G
// (groups nested, fields in any order, unknown fields, bytes that would
// parse as a message) and on every prefix of each, which a level cannot
// read to its end: a fingerprint stored before still matches.
func TestSortFieldsAsBefore(t *testing.T) {
	md := sortFieldsSchema(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var gen func(depth int) []byte
	gen = func(depth int) []byte {
		var b []byte
		for range rng.IntN(6) {
			switch num := protowire.Number(1 + rng.IntN(9)); {
			case num == 1 && depth < 4:
				b = protowire.AppendTag(b, 1, protowire.StartGroupType)
				b = append(b, gen(depth+1)...)
				b = protowire.AppendTag(b, 1, protowire.EndGroupType)
			case num == 6 || num == 7 || num == 9:
				b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), gen(depth+1))
			default:
				b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), rng.Uint64()%300)
			}
		}
		return b
	}
	for range 500 {
		in := gen(0)
		for n := len(in); n >= 0; n-- {
			want, got := bytes.Clone(in[:n]), bytes.Clone(in[:n])
			previousSortFields(want, md)
			sortFields(got, md)
			if !bytes.Equal(got, want) {
				t.Fatalf("sortFields(%x):\n got %x\nwant %x", in[:n], got, want)
			}
		}
	}
}

// previousSortFields is sortFields as the release before wrote it: each
// level sorted in place, after the levels inside it.
func previousSortFields(b []byte, md protoreflect.MessageDescriptor) {
	sorted := true
	var prev protowire.Number
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return
		}
		if sub := subMessage(md, num, typ); sub != nil {
			v := b[i+n : i+n+m]
			if typ == protowire.BytesType {
				_, k := protowire.ConsumeVarint(v)
				v = v[k:]
			} else {
				v = v[:len(v)-protowire.SizeTag(num)]
			}
			previousSortFields(v, sub)
		}
		if num < prev {
			sorted = false
		}
		prev = max(prev, num)
		i += n + m
	}
	if sorted {
		return
	}
	type field struct {
		num        protowire.Number
		start, end int
	}
	var fields []field
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		fields = append(fields, field{num, i, i + n + m})
		i += n + m
	}
	slices.SortStableFunc(fields, func(x, y field) int { return int(x.num) - int(y.num) })
	out := make([]byte, 0, len(b))
	for _, f := range fields {
		out = append(out, b[f.start:f.end]...)
	}
	copy(b, out)
}
