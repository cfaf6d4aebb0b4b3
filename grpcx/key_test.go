package grpcx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/sourcecontextpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/typepb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

func TestCheckKey(t *testing.T) {
	for _, ok := range []string{"a", "0190f5c4-7b1e-7cc2-a9d1-3f4a5b6c7d8e", strings.Repeat("~", grpcx.MaxKeyLen), `"quoted"`} {
		if err := grpcx.CheckKey(ok); err != nil {
			t.Errorf("CheckKey(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", " ", "a b", "tab\t", strings.Repeat("k", grpcx.MaxKeyLen+1), "é", "\x7f"} {
		if err := grpcx.CheckKey(bad); !errors.Is(err, grpcx.ErrMalformedKey) {
			t.Errorf("CheckKey(%q) = %v, want ErrMalformedKey", bad, err)
		}
	}
}

func TestKeyFromField(t *testing.T) {
	ctx := context.Background()
	typ := &typepb.Type{Name: "n", SourceContext: &sourcecontextpb.SourceContext{FileName: "req-1"}}
	for _, tc := range []struct {
		path string
		req  any
		want string
		err  string
	}{
		{"name", typ, "n", ""},
		{"source_context.file_name", typ, "req-1", ""},
		{"source_context.file_name", &typepb.Type{}, "", ""}, // unset message on the path: no key
		{"nope", typ, "", "has no field"},
		{"fields", typ, "", "repeated"},
		{"syntax", typ, "", "not a string"},
		{"name.x", typ, "", "not a message"},
		{"name", "not proto", "", "not a proto.Message"},
	} {
		got, err := grpcx.KeyFromField(tc.path)(ctx, tc.req)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s on %T: %q, %v; want %q, error containing %q", tc.path, tc.req, got, err, tc.want, tc.err)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("KeyFromField(\"a..b\") did not panic")
			}
		}()
		grpcx.KeyFromField("a..b")
	}()
}

// TestKeyFromFieldServer: a method that takes its key from the request
// ignores the metadata, replays a repeat, and answers InvalidArgument
// when the field is empty.
func TestKeyFromFieldServer(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	var runs int
	desc := p.desc()
	desc.Methods = append(desc.Methods, method("Define", func() *typepb.Type { return &typepb.Type{} },
		func(ctx context.Context, req *typepb.Type) (*structpb.ListValue, error) {
			runs++
			return structpb.NewList([]any{req.GetName(), float64(runs)})
		}))
	const define = "/" + service + "/Define"
	g := grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{Methods: []string{define}, Key: grpcx.KeyFromField("source_context.file_name")}))
	conn := serveWith(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{g}}, desc)
	ctx := context.Background()
	req := &typepb.Type{Name: "order", SourceContext: &sourcecontextpb.SourceContext{FileName: "req-7"}}
	a := invoke(ctx, conn, define, "metadata-key-ignored", req)
	b := invoke(ctx, conn, define, "another-ignored", req)
	if a.err != nil || b.err != nil || !b.replayed() || runs != 1 {
		t.Fatalf("%v %v replayed %v runs %d", a.err, b.err, b.replayed(), runs)
	}
	c := invoke(ctx, conn, define, "k", &typepb.Type{Name: "order"})
	if code, reason, _, _ := statusOf(t, c.err); code != codes.InvalidArgument || reason != grpcx.ReasonKeyMissing {
		t.Fatalf("no field: %v", c.err)
	}
	if _, err := e.g.Get(ctx, guard.Key{Scope: define, ID: "req-7"}); err != nil {
		t.Fatalf("the key is the field's: %v", err)
	}
}
