package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestHeaderAfterSendHeader: once the handler sent its header
// (grpc.SendHeader), gRPC refuses more header metadata (SetHeader, a
// second SendHeader return an error) and the client never gets it. A
// replay is the response the client got, as httpx stores the header as
// it was when the status went out: without the refused metadata.
func TestHeaderAfterSendHeader(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var refused []error
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if err := grpc.SendHeader(ctx, metadata.Pairs("x-sent", "yes")); err != nil {
			return nil, err
		}
		refused = append(refused, grpc.SetHeader(ctx, metadata.Pairs("x-late", "set")),
			grpc.SendHeader(ctx, metadata.Pairs("x-late-send", "sent")))
		return structpb.NewList([]any{float64(n)})
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	first := charge(ctx, conn, "h-1", 5)
	second := charge(ctx, conn, "h-1", 5)
	if first.err != nil || second.err != nil || !second.replayed() || p.runs.Load() != 1 {
		t.Fatalf("first %v, second %v replayed %v, runs %d", first.err, second.err, second.replayed(), p.runs.Load())
	}
	for _, err := range refused {
		if err == nil {
			t.Fatalf("gRPC took header metadata after SendHeader; the test no longer shows anything")
		}
	}
	for _, k := range []string{"x-late", "x-late-send"} {
		if got := first.header.Get(k); len(got) != 0 {
			t.Fatalf("the first call got %s %q after SendHeader", k, got)
		}
		if got := second.header.Get(k); len(got) != 0 {
			t.Errorf("the replay has header %s %q, which the first call never got", k, got)
		}
	}
	if got := second.header.Get("x-sent"); len(got) != 1 || got[0] != "yes" {
		t.Errorf("replayed x-sent %q, want [yes]", got)
	}
}
