package grpcx_test

import (
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "google.golang.org/protobuf/types/known/anypb" // google/protobuf/any.proto for fpext
)

// Schemas for the fingerprint tests, without generated code: two
// versions of one proto3 file, as an old and a new server know it, and a
// proto2 file with extensions.
//
//	// fptest, old                        // fptest, new
//	message Meta { string note = 2; }     message Meta { int32 priority = 1; string note = 2; }
//	                                      message Detail { string ref = 1; int64 cents = 2; }
//	message Charge {                      message Charge {
//	  string id = 1;                        string id = 1;
//	                                        string memo = 2;
//	  int64 amount = 3;                     int64 amount = 3;
//	                                        Detail detail = 4;
//	  Meta meta = 5;                        Meta meta = 5;
//	}                                     }
//
//	// fpext (proto2, import "google/protobuf/any.proto")
//	message Order { optional string id = 1; extensions 100 to 199; }
//	extend Order { optional int64 tip = 100; optional google.protobuf.Any attachment = 101; }
//	message Wrapper { optional google.protobuf.Any packed = 1; }
const (
	fpChargeName = "idemguard.fptest.Charge"
	fpOrderName  = "idemguard.fpext.Order"
)

type fdp = descriptorpb.FieldDescriptorProto

func pfield(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *fdp {
	f := &fdp{Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(),
		Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(name)}
	if typeName != "" {
		f.TypeName = proto.String(typeName)
	}
	return f
}

func pmessage(name string, fields ...*fdp) *descriptorpb.DescriptorProto {
	return &descriptorpb.DescriptorProto{Name: proto.String(name), Field: fields}
}

func newFile(t testing.TB, fd *descriptorpb.FileDescriptorProto) protoreflect.FileDescriptor {
	t.Helper()
	f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

const (
	tString  = descriptorpb.FieldDescriptorProto_TYPE_STRING
	tInt64   = descriptorpb.FieldDescriptorProto_TYPE_INT64
	tInt32   = descriptorpb.FieldDescriptorProto_TYPE_INT32
	tMessage = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
)

// chargeSchemas returns fptest's Charge as the old and the new server know it.
func chargeSchemas(t testing.TB) (old, new protoreflect.MessageDescriptor) {
	t.Helper()
	oldFile := newFile(t, &descriptorpb.FileDescriptorProto{
		Name: proto.String("fptest/old.proto"), Package: proto.String("idemguard.fptest"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			pmessage("Meta", pfield("note", 2, tString, "")),
			pmessage("Charge", pfield("id", 1, tString, ""), pfield("amount", 3, tInt64, ""),
				pfield("meta", 5, tMessage, ".idemguard.fptest.Meta")),
		},
	})
	newFile := newFile(t, &descriptorpb.FileDescriptorProto{
		Name: proto.String("fptest/new.proto"), Package: proto.String("idemguard.fptest"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			pmessage("Meta", pfield("priority", 1, tInt32, ""), pfield("note", 2, tString, "")),
			pmessage("Detail", pfield("ref", 1, tString, ""), pfield("cents", 2, tInt64, "")),
			pmessage("Charge", pfield("id", 1, tString, ""), pfield("memo", 2, tString, ""),
				pfield("amount", 3, tInt64, ""), pfield("detail", 4, tMessage, ".idemguard.fptest.Detail"),
				pfield("meta", 5, tMessage, ".idemguard.fptest.Meta")),
		},
	})
	return oldFile.Messages().ByName("Charge"), newFile.Messages().ByName("Charge")
}

// newCharge is a Charge as a client on the new schema builds it.
func newCharge(t testing.TB, md protoreflect.MessageDescriptor, memo string) *dynamicpb.Message {
	t.Helper()
	set := func(m *dynamicpb.Message, name string, v any) {
		m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(name)), protoreflect.ValueOf(v))
	}
	m := dynamicpb.NewMessage(md)
	set(m, "id", "ch-1")
	set(m, "memo", memo)
	set(m, "amount", int64(100))
	detail := dynamicpb.NewMessage(md.Fields().ByName("detail").Message())
	set(detail, "ref", "inv-7")
	set(detail, "cents", int64(5))
	set(m, "detail", detail.ProtoReflect())
	meta := dynamicpb.NewMessage(md.Fields().ByName("meta").Message())
	set(meta, "priority", int32(7))
	set(meta, "note", "rent")
	set(m, "meta", meta.ProtoReflect())
	return m
}

// decodeAs decodes b as a server with schema md does.
func decodeAs(t testing.TB, md protoreflect.MessageDescriptor, b []byte) *dynamicpb.Message {
	t.Helper()
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// fpext's types are registered once in protoregistry.GlobalTypes, as
// generated code registers its own: a server resolves extensions, and the
// types in Anys, from there.
var (
	fpextOrder                protoreflect.MessageDescriptor
	fpextWrapper              protoreflect.MessageDescriptor
	fpextTip, fpextAttachment protoreflect.ExtensionTypeDescriptor
	fpextOnce                 sync.Once
)

func extSchema(t testing.TB) {
	t.Helper()
	fpextOnce.Do(func() { registerExt(t) })
	if fpextAttachment == nil {
		t.Fatal("fpext not registered")
	}
}

func registerExt(t testing.TB) {
	ext := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *fdp {
		f := pfield(name, num, typ, typeName)
		f.Extendee = proto.String("." + fpOrderName)
		f.JsonName = nil
		return f
	}
	f := newFile(t, &descriptorpb.FileDescriptorProto{
		Name: proto.String("fpext/ext.proto"), Package: proto.String("idemguard.fpext"), Syntax: proto.String("proto2"),
		Dependency: []string{"google/protobuf/any.proto"},
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Order"), Field: []*fdp{pfield("id", 1, tString, "")},
				ExtensionRange: []*descriptorpb.DescriptorProto_ExtensionRange{{Start: proto.Int32(100), End: proto.Int32(200)}}},
			pmessage("Wrapper", pfield("packed", 1, tMessage, ".google.protobuf.Any")),
		},
		Extension: []*fdp{ext("tip", 100, tInt64, ""), ext("attachment", 101, tMessage, ".google.protobuf.Any")},
	})
	fpextOrder, fpextWrapper = f.Messages().ByName("Order"), f.Messages().ByName("Wrapper")
	if err := protoregistry.GlobalTypes.RegisterMessage(dynamicpb.NewMessageType(fpextOrder)); err != nil {
		t.Fatal(err)
	}
	for i, x := range []*protoreflect.ExtensionTypeDescriptor{&fpextTip, &fpextAttachment} {
		xt := dynamicpb.NewExtensionType(f.Extensions().Get(i))
		if err := protoregistry.GlobalTypes.RegisterExtension(xt); err != nil {
			t.Fatal(err)
		}
		*x = xt.TypeDescriptor()
	}
}
