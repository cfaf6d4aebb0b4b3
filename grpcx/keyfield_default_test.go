package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// defaultKeyRequest is a proto2 request whose key field has a default:
//
//	message Req { optional string request_id = 1 [default = "none"]; optional string item = 2; }
func defaultKeyRequest(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("keydefault/keydefault.proto"),
		Package: proto.String("keydefault"),
		Syntax:  proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Req"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("request_id"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
					Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), DefaultValue: proto.String("none")},
				{Name: proto.String("item"), Number: proto.Int32(2), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
					Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()},
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("Req")
}

// TestKeyFromFieldUnsetDefault: KeyFromField's doc says "A request
// without the field set ... has no key". A proto2 (or editions) string
// field with a default reads as its default when unset, and KeyFromField
// took that as the key: with Optional, two requests that carry no key
// (meant to pass unguarded) shared the key "none", and the second, another
// request, was refused FailedPrecondition (key reused); an identical one
// would have been replayed instead of run (found by review).
func TestKeyFromFieldUnsetDefault(t *testing.T) {
	md := defaultKeyRequest(t)
	unset := dynamicpb.NewMessage(md)
	if key, err := grpcx.KeyFromField("request_id")(context.Background(), unset); err != nil || key != "" {
		t.Errorf("KeyFromField on a request without request_id: %q, %v; want no key", key, err)
	}

	p, conn := keyFieldCharges(t, md)
	ctx := context.Background()
	for i, item := range []string{"book", "pen"} {
		req := dynamicpb.NewMessage(md)
		req.Set(md.Fields().ByName("item"), protoreflect.ValueOfString(item))
		if c := invoke(ctx, conn, chargeName, "", req); c.err != nil {
			t.Fatalf("call %d (item %s, no request_id): %v (reason %s); want it run unguarded", i+1, item, c.err, grpcx.Reason(c.err))
		}
	}
	if n := p.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// TestKeyFromFieldSetEmpty: a key field with presence set to "" is an
// empty key: InvalidArgument (ReasonKeyMalformed), as an empty
// idempotency-key value gets, and nothing runs. It was read as no key:
// with Optional, every copy ran unguarded (found by review).
func TestKeyFromFieldSetEmpty(t *testing.T) {
	md := defaultKeyRequest(t)
	p, conn := keyFieldCharges(t, md)
	ctx := context.Background()
	for i := range 2 {
		req := dynamicpb.NewMessage(md)
		req.Set(md.Fields().ByName("request_id"), protoreflect.ValueOfString(""))
		req.Set(md.Fields().ByName("item"), protoreflect.ValueOfString("book"))
		c := invoke(ctx, conn, chargeName, "", req)
		if code, reason, _, _ := statusOf(t, c.err); code != codes.InvalidArgument || reason != grpcx.ReasonKeyMalformed {
			t.Errorf("call %d with request_id set to \"\": %v (reason %q); want InvalidArgument %s", i+1, c.err, reason, grpcx.ReasonKeyMalformed)
		}
	}
	if n := p.runs.Load(); n != 0 {
		t.Errorf("handler ran %d times for a request with an empty key; want 0", n)
	}
}

// keyFieldCharges serves Charge, taking md requests, guarded with the key
// from their request_id field (Optional: a request without one runs
// unguarded).
func keyFieldCharges(t *testing.T, md protoreflect.MessageDescriptor) (*payments, *grpc.ClientConn) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	desc := &grpc.ServiceDesc{ServiceName: service, HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{
		method("Charge", func() *dynamicpb.Message { return dynamicpb.NewMessage(md) },
			func(ctx context.Context, _ *dynamicpb.Message) (*structpb.ListValue, error) {
				return p.charge(ctx, amountReq(1))
			}),
	}}
	return p, serveWith(t, p, guarded(e, grpcx.Options{Key: grpcx.KeyFromField("request_id"), Optional: true}), desc)
}
