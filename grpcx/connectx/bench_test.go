package connectx_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// BenchmarkInterceptor compares one Connect procedure with and without the
// interceptor on the real Redis, over HTTP/2 on loopback, Connect's
// protocol and gRPC's, at one concurrency (RunParallel with 8 goroutines
// per core). "guarded" sends a new key per call; "replay" repeats one key.
//
//	go test -run XXX -bench Interceptor -benchmem ./connectx   (in grpcx/, with the services' env)
func BenchmarkInterceptor(b *testing.B) {
	g := newGuard(b, "")
	resp, _ := structpb.NewList([]any{"ch_1", "created", 1000.0, "EUR"})
	p := &payments{fn: func(context.Context, *connect.Request[structpb.Struct], int64) (*connect.Response[structpb.ListValue], error) {
		return connect.NewResponse(resp), nil
	}}
	var seq atomic.Int64
	for _, protocol := range []string{"connect", "grpc"} {
		for _, bc := range []struct {
			name    string
			guarded bool
			sameKey bool
		}{{"plain", false, false}, {"guarded", true, false}, {"replay", true, true}} {
			b.Run(protocol+"/"+bc.name, func(b *testing.B) {
				var ic []connect.Interceptor
				if bc.guarded {
					ic = append(ic, connectx.NewInterceptor(g, guardOpts(b, connectx.Options{})))
				}
				srv := serve(b, p, ic...)
				var opts []connect.ClientOption
				if protocol == "grpc" {
					opts = append(opts, connect.WithGRPC())
				}
				c := newClient(srv, opts...)
				b.SetParallelism(8)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						key := "the-same-key"
						if !bc.sameKey {
							key = "k" + strconv.FormatInt(seq.Add(1), 36)
						}
						if _, err := c.CallUnary(context.Background(), amountReq(1000, key)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
