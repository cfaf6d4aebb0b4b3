package grpcx_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// BenchmarkInterceptor compares one unary method with and without the
// server interceptor on the real Redis, in one run at one concurrency
// (RunParallel with 8 goroutines per core), client and server in this
// process over bufconn and over loopback TCP. "guarded" sends a new key per
// call (claim + complete); "replay" repeats one key.
//
//	go test -run XXX -bench Interceptor -benchmem ./...   (in grpcx/, with the services' env)
func BenchmarkInterceptor(b *testing.B) {
	e := newEnv(b, guard.Options{})
	resp, _ := structpb.NewList([]any{"ch_1", "created", 1000.0, "EUR"})
	p := &payments{fn: func(context.Context, *structpb.Struct, int64) (*structpb.ListValue, error) { return resp, nil }}
	req := amountReq(1000)
	var seq atomic.Int64
	for _, net := range []string{"bufconn", "tcp"} {
		for _, bc := range []struct {
			name    string
			guarded bool
			sameKey bool
		}{{"plain", false, false}, {"guarded", true, false}, {"replay", true, true}} {
			b.Run(net+"/"+bc.name, func(b *testing.B) {
				so := serveOpts{tcp: net == "tcp"}
				if bc.guarded {
					so.interceptors = []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(e.g, guardOpts(b, grpcx.Options{}))}
				}
				conn := serve(b, p, so)
				b.SetParallelism(8)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					out := &structpb.ListValue{}
					for pb.Next() {
						key := "the-same-key"
						if !bc.sameKey {
							key = "k" + strconv.FormatInt(seq.Add(1), 36)
						}
						ctx := metadata.AppendToOutgoingContext(context.Background(), grpcx.DefaultMetadata, key)
						if err := conn.Invoke(ctx, chargeName, req, out); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkFingerprint is DefaultFingerprint alone (no store): a
// google.protobuf.Struct request, the same packed in an Any, and a request
// holding fields its server does not know.
//
//	go test -run XXX -bench Fingerprint -benchmem   (in grpcx/)
func BenchmarkFingerprint(b *testing.B) {
	oldMD, newMD := chargeSchemas(b)
	wire := clientBytes(b, newCharge(b, newMD, "rent"))
	packed, err := anypb.New(amountReq(1000))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		req  proto.Message
	}{{"struct", amountReq(1000)}, {"any", packed}, {"known", decodeAs(b, newMD, wire)}, {"unknown", decodeAs(b, oldMD, wire)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := grpcx.DefaultFingerprint(chargeName, bc.req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
