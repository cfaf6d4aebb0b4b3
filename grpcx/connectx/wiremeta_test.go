package connectx_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestWireErrorMetaNotReplayed: a handler that passes on a
// downstream call's error (a wire error, whose Meta holds the downstream
// server's response headers and trailers) sends the client none of that
// metadata: connect-go strips it "to avoid leaking response headers". The
// stored error's replay does not send it either. (It was stored, and the
// replay, a new error, sent it.)
func TestWireErrorMetaNotReplayed(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
		// What a downstream Connect client returns: a wire error carrying
		// the downstream response's metadata.
		ce := connect.NewWireError(connect.CodeFailedPrecondition, errors.New("downstream refused"))
		ce.Meta().Set("X-Downstream-Internal", "secret")
		return nil, ce
	}}
	srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	for _, proto := range []struct {
		name string
		opts []connect.ClientOption
	}{{"connect", nil}, {"grpc", []connect.ClientOption{connect.WithGRPC()}}} {
		t.Run(proto.name, func(t *testing.T) {
			c := newClient(srv, proto.opts...)
			key := "wire-" + proto.name
			_, err1 := c.CallUnary(context.Background(), amountReq(5, key))
			_, err2 := c.CallUnary(context.Background(), amountReq(5, key))
			var ce1, ce2 *connect.Error
			if !errors.As(err1, &ce1) || !errors.As(err2, &ce2) {
				t.Fatalf("errors: %v, %v", err1, err2)
			}
			if ce1.Code() != connect.CodeFailedPrecondition || ce2.Code() != connect.CodeFailedPrecondition {
				t.Fatalf("codes: %v, %v", ce1.Code(), ce2.Code())
			}
			if got := ce1.Meta().Get("X-Downstream-Internal"); got != "" {
				t.Fatalf("first call sent the wire error's metadata %q (connect-go should strip it)", got)
			}
			if !replayed(ce2.Meta()) {
				t.Fatalf("second call not a replay: meta %v", ce2.Meta())
			}
			if got := ce2.Meta().Get("X-Downstream-Internal"); got != "" {
				t.Errorf("replay sent X-Downstream-Internal: %q, which the first call never sent (the downstream's metadata leaks on replays)", got)
			}
			if n := p.runs.Load(); n == 0 {
				t.Fatal("handler never ran")
			}
		})
	}
}
