package core

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
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
//	}
func TestSortFields(t *testing.T) {
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
	md := f.Messages().ByName("G")
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
