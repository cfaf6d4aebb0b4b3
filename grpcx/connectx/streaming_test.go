package connectx_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// streamsService is a service linked into the test program (registered
// in protoregistry.GlobalFiles, as generated code registers its own) with
// a unary, a server-streaming and a client-streaming method.
const streamsService = "idemguard.test.Streams"

func init() {
	method := func(name string, client, server bool) *descriptorpb.MethodDescriptorProto {
		return &descriptorpb.MethodDescriptorProto{Name: proto.String(name),
			InputType: proto.String(".google.protobuf.Struct"), OutputType: proto.String(".google.protobuf.Struct"),
			ClientStreaming: proto.Bool(client), ServerStreaming: proto.Bool(server)}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("idemguard/test/streams.proto"), Package: proto.String("idemguard.test"), Syntax: proto.String("proto3"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Streams"), Method: []*descriptorpb.MethodDescriptorProto{
			method("Charge", false, false), method("Watch", false, true), method("Upload", true, false),
		}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
}

// TestStreamingProcedureRefused: a streaming procedure listed in
// Options.Procedures would run unguarded (a unary interceptor never sees
// it). NewInterceptor panics when the linked descriptors say a procedure
// streams; one whose service is not linked is refused when called, never
// run.
func TestStreamingProcedureRefused(t *testing.T) {
	g := newGuard(t, "")
	for _, p := range []string{"Watch", "Upload"} {
		proc := "/" + streamsService + "/" + p
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmtPanic(r), proc) {
					t.Errorf("NewInterceptor with the streaming %s: panic %v, want one naming it", proc, r)
				}
			}()
			connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Procedures: []string{charge, proc}}))
		}()
	}
	// Unary, unknown and unlinked procedures build.
	connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Procedures: []string{
		"/" + streamsService + "/Charge", "/" + streamsService + "/Nope", "/idemguard.test.Unlinked/Watch"}}))

	// A streaming procedure of a service that is not linked: refused when
	// called; one not listed passes through.
	const listed, other = "/idemguard.test.Unlinked/Watch", "/idemguard.test.Unlinked/Other"
	var runs atomic.Int64
	watch := func(ctx context.Context, req *connect.Request[structpb.Struct], s *connect.ServerStream[structpb.Struct]) error {
		runs.Add(1)
		return s.Send(req.Msg)
	}
	guarded := connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Procedures: []string{charge, listed}}))
	mux := http.NewServeMux()
	for _, proc := range []string{listed, other} {
		mux.Handle(proc, connect.NewServerStreamHandler(proc, watch, connect.WithInterceptors(guarded)))
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	call := func(proc string) (int, error) {
		c := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+proc)
		req := connect.NewRequest(&structpb.Struct{})
		req.Header().Set(connectx.DefaultHeader, "k-1")
		st, err := c.CallServerStream(context.Background(), req)
		if err != nil {
			return 0, err
		}
		defer func() { _ = st.Close() }()
		n := 0
		for st.Receive() {
			n++
		}
		return n, st.Err()
	}
	if n, err := call(listed); connect.CodeOf(err) != connect.CodeInternal || n != 0 || runs.Load() != 0 {
		t.Fatalf("listed streaming procedure: %d messages, %v, handler runs %d; want CodeInternal and no run", n, err, runs.Load())
	}
	if n, err := call(other); err != nil || n != 1 || runs.Load() != 1 {
		t.Fatalf("unlisted streaming procedure: %d messages, %v, handler runs %d", n, err, runs.Load())
	}
}

func fmtPanic(r any) string {
	if err, ok := r.(error); ok {
		return err.Error()
	}
	s, _ := r.(string)
	return s
}
