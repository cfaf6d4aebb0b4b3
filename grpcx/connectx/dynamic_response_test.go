package connectx_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// dynFile builds, without registering it anywhere, the file pkg/name.proto
// of package pkg with messages of one string field each, importing deps.
func dynFile(t *testing.T, pkg, name string, fields map[string]string, deps ...protoreflect.FileDescriptor) protoreflect.FileDescriptor {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{Name: proto.String(pkg + "/" + name + ".proto"), Package: proto.String(pkg), Syntax: proto.String("proto3")}
	files := new(protoregistry.Files)
	for _, d := range deps {
		fdp.Dependency = append(fdp.Dependency, d.Path())
		if err := files.RegisterFile(d); err != nil {
			t.Fatal(err)
		}
	}
	for msg, field := range fields {
		fdp.MessageType = append(fdp.MessageType, &descriptorpb.DescriptorProto{Name: proto.String(msg), Field: []*descriptorpb.FieldDescriptorProto{{
			Name: proto.String(field), Number: proto.Int32(1), JsonName: proto.String(field),
			Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}}})
	}
	fd, err := protodesc.NewFile(fdp, files)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestDynamicResponseReplay: a handler of dynamic messages (a gateway or a
// proxy on dynamicpb) whose types no registry knows and that gives no
// connect.WithSchema. Its stored response is replayed to a JSON client
// when the request's file (or a file it imports) declares the response
// type; when none does, a JSON client's repeat is refused (Internal), not
// answered an empty success: it was answered 200 {} (found by review). A
// binary client's repeat gets the stored bytes either way.
func TestDynamicResponseReplay(t *testing.T) {
	shared := dynFile(t, "dynshared", "refund", map[string]string{"Refund": "id"})
	for _, tc := range []struct {
		name     string
		req, res protoreflect.MessageDescriptor
		json     bool // a JSON client's repeat is replayed (else refused)
	}{
		{"same file", dynFile(t, "dyn1", "api", map[string]string{"RefundRequest": "order", "Refund": "id"}).Messages().ByName("RefundRequest"),
			nil, true},
		{"imported file", dynFile(t, "dyn2", "api", map[string]string{"RefundRequest": "order"}, shared).Messages().ByName("RefundRequest"),
			shared.Messages().ByName("Refund"), true},
		{"unknown file", dynFile(t, "dyn3", "api", map[string]string{"RefundRequest": "order"}).Messages().ByName("RefundRequest"),
			dynFile(t, "dyn3other", "refund", map[string]string{"Refund": "id"}).Messages().ByName("Refund"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.res
			if res == nil {
				res = tc.req.ParentFile().Messages().ByName("Refund")
			}
			procedure := "/" + string(tc.req.ParentFile().Package()) + ".Refunds/Refund"
			var runs atomic.Int64
			h := connect.NewUnaryHandler(procedure, func(ctx context.Context, req *connect.Request[dynamicpb.Message]) (*connect.Response[dynamicpb.Message], error) {
				m := dynamicpb.NewMessage(res)
				m.Set(res.Fields().ByName("id"), protoreflect.ValueOfString(fmt.Sprintf("rf-%d", runs.Add(1))))
				return connect.NewResponse(m), nil
			}, connect.WithRequestInitializer(func(_ connect.Spec, msg any) error {
				*msg.(*dynamicpb.Message) = *dynamicpb.NewMessage(tc.req)
				return nil
			}), connect.WithInterceptors(connectx.NewInterceptor(newGuard(t, ""), guardOpts(t, connectx.Options{Procedures: []string{procedure}}))))
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			post := func(key, contentType, body string) (int, http.Header, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+procedure, strings.NewReader(body))
				req.Header.Set("Content-Type", contentType)
				req.Header.Set(connectx.DefaultHeader, key)
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, resp.Header, string(b)
			}

			c1, _, b1 := post("json", "application/json", `{"order":"o-1"}`)
			c2, h2, b2 := post("json", "application/json", `{"order":"o-1"}`)
			switch {
			case c1 != 200 || b1 != `{"id":"rf-1"}`:
				t.Fatalf("first JSON call: %d %s", c1, b1)
			case tc.json && (c2 != 200 || b2 != b1 || !replayed(h2)):
				t.Errorf("JSON repeat: %d %s (replayed %v); want the first response %s replayed", c2, b2, replayed(h2), b1)
			case !tc.json && c2 == 200:
				t.Errorf("JSON repeat: %d %s (replayed %v); want it refused, not a success without the refund's id", c2, b2, replayed(h2))
			}

			order, _ := proto.Marshal(func() proto.Message {
				m := dynamicpb.NewMessage(tc.req)
				m.Set(tc.req.Fields().ByName("order"), protoreflect.ValueOfString("o-2"))
				return m
			}())
			c3, _, b3 := post("proto", "application/proto", string(order))
			c4, h4, b4 := post("proto", "application/proto", string(order))
			if c3 != 200 || c4 != 200 || b4 != b3 || !replayed(h4) || runs.Load() != 2 {
				t.Errorf("binary calls: %d then %d (replayed %v), same bytes %v, %d runs; want the first replayed, 2 runs", c3, c4, replayed(h4), b3 == b4, runs.Load())
			}
		})
	}
}
