package grpcx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestMetadataAfterClientLeft: a handler that made its effect and then
// sets its metadata (grpc.SetHeader, SendHeader, SetTrailer), returning
// the error as Go handlers do, after the client left (its deadline
// passed, it hung up: the response is lost, the client will retry), is
// not told that gRPC's stream refused them: the guard keeps the copy a
// retry is replayed, and nothing reaches a client that left. Told, it
// returns Internal, which releases the key, and the retry makes the
// effect again.
func TestMetadataAfterClientLeft(t *testing.T) {
	for _, set := range []struct {
		name string
		fn   func(ctx context.Context, md metadata.MD) error
	}{
		{"SetHeader", grpc.SetHeader},
		{"SendHeader", grpc.SendHeader},
		{"SetTrailer", grpc.SetTrailer},
	} {
		t.Run(set.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			entered, finished := make(chan struct{}, 1), make(chan error, 1)
			p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (resp *structpb.ListValue, err error) {
				if n > 1 {
					return structpb.NewList([]any{float64(n)}) // the effect again
				}
				defer func() { finished <- err }()
				entered <- struct{}{}
				<-ctx.Done() // the effect took longer than the client waited
				if err := set.fn(ctx, metadata.Pairs("x-charge", "ch-1")); err != nil {
					return nil, err
				}
				return structpb.NewList([]any{float64(n)})
			}}
			conn := serve(t, p, guarded(e, grpcx.Options{}))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan call, 1)
			go func() { done <- charge(ctx, conn, "left-1", 1) }()
			<-entered
			cancel()
			if c := <-done; status.Code(c.err) != codes.Canceled {
				t.Fatalf("the call the client left: %v", c.err)
			}
			if err := <-finished; err != nil {
				t.Errorf("%s after the client left: %v; want nil, the metadata kept for the replay", set.name, err)
			}
			testenv.WaitFor(t, 10*time.Second, "the left call's record to be written", func() bool {
				rec, err := e.g.Get(context.Background(), guard.Key{Scope: chargeName, ID: "left-1"})
				return errors.Is(err, guard.ErrNotFound) || err == nil && rec.State != guard.StatePending
			})
			c := charge(context.Background(), conn, "left-1", 1)
			md := c.header
			if set.name == "SetTrailer" {
				md = c.trailer
			}
			if c.err != nil || !c.replayed() || p.runs.Load() != 1 || len(md.Get("x-charge")) != 1 {
				t.Fatalf("retry: %v replayed %v, runs %d (want 1), metadata %v", c.err, c.replayed(), p.runs.Load(), md)
			}
		})
	}
}
