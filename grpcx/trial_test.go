package grpcx_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestTrialOOMMidHandler: a private Redis runs out of memory while the
// handler runs (docs/design.md, section 5): the holder still completes
// (allow-oom), so a retry of the key is replayed and the handler does not
// run again; a new key is refused Unavailable with RetryInfo, nothing run.
func TestTrialOOMMidHandler(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	store := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(store, guard.Options{})
	p := &payments{}
	p.fn = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if err := rdb.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
			t.Error(err)
		}
		return chargeResponse(ctx, req, n)
	}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(g, guardOpts(t, grpcx.Options{}))}})
	ctx := context.Background()
	first := invokeRaw(ctx, conn, chargeName, "oom-1", amountReq(5))
	if first.err != nil {
		t.Fatal(first.err)
	}
	if err := rdb.Set(ctx, "trial-filler", "x", 0).Err(); err == nil {
		t.Fatal("the private Redis is not out of memory")
	}
	again := invokeRaw(ctx, conn, chargeName, "oom-1", amountReq(5))
	if again.err != nil || !again.replayed() || !bytes.Equal(again.raw, first.raw) || p.runs.Load() != 1 {
		t.Fatalf("retry under OOM: %v replayed %v, runs %d", again.err, again.replayed(), p.runs.Load())
	}
	fresh := charge(ctx, conn, "oom-2", 5)
	code, reason, d, ok := statusOf(t, fresh.err)
	if code != codes.Unavailable || reason != grpcx.ReasonStoreUnavailable || !ok || d != time.Second || p.runs.Load() != 1 {
		t.Fatalf("new key under OOM: %v %q RetryInfo %v %v, runs %d", code, reason, d, ok, p.runs.Load())
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if c := charge(ctx, conn, "oom-2", 5); c.err != nil || c.replayed() || p.runs.Load() != 2 {
		t.Fatalf("new key after OOM: %v replayed %v, runs %d", c.err, c.replayed(), p.runs.Load())
	}
}

// TestTrialStoredStatusExact: a stored error status is replayed as the
// first call got it: code, message, every detail (bytes equal), header
// and trailer metadata, with idempotent-replayed: true.
func TestTrialStoredStatusExact(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-decline", "card"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "declined", "x-multi", "a", "x-multi", "b"))
		st, err := status.New(codes.FailedPrecondition, "card declined: insufficient funds").WithDetails(
			&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "pay.example", Metadata: map[string]string{"b": "2", "a": "1", "c": "3"}},
			&errdetails.LocalizedMessage{Locale: "fr", Message: "carte refusée"},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too much"}}})
		if err != nil {
			t.Error(err)
		}
		return nil, st.Err()
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	first := charge(ctx, conn, "st-1", 9)
	second := charge(ctx, conn, "st-1", 9)
	if p.runs.Load() != 1 || first.replayed() || !second.replayed() {
		t.Fatalf("runs %d, replayed %v %v", p.runs.Load(), first.replayed(), second.replayed())
	}
	a, b := status.Convert(first.err).Proto(), status.Convert(second.err).Proto()
	if !proto.Equal(a, b) || len(a.GetDetails()) != 3 {
		t.Fatalf("replayed status\n%v\nwant\n%v", b, a)
	}
	for i := range a.GetDetails() {
		if !bytes.Equal(a.GetDetails()[i].GetValue(), b.GetDetails()[i].GetValue()) {
			t.Fatalf("detail %d bytes differ", i)
		}
	}
	if got := second.header.Get("x-decline"); len(got) != 1 || got[0] != "card" {
		t.Fatalf("replayed header %q", got)
	}
	for _, k := range []string{"x-ledger", "x-multi"} {
		if got, want := second.trailer.Get(k), first.trailer.Get(k); len(want) == 0 || len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Fatalf("replayed trailer %s = %q, first had %q", k, got, want)
		}
	}
}

// TestTrialRaceOneKey: 64 goroutines send one key at once through the
// retrying client (Aborted + RetryInfo) and, on a second key, with
// Options.Wait: the handler runs once per key, never two runs at a time,
// and every call gets the first response's bytes.
func TestTrialRaceOneKey(t *testing.T) {
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run(map[bool]string{true: "Wait", false: "Aborted"}[wait > 0], func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var inside, overlaps atomic.Int64
			p := &payments{}
			p.fn = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer inside.Add(-1)
				time.Sleep(30 * time.Millisecond) // the effect's run time
				return chargeResponse(ctx, req, n)
			}
			so := guarded(e, grpcx.Options{Wait: wait})
			so.tcp = true
			so.client = []grpc.UnaryClientInterceptor{grpcx.UnaryClientInterceptor(grpcx.ClientOptions{})}
			conn := serve(t, p, so)
			calls := make([]call, 64)
			var wg sync.WaitGroup
			for i := range calls {
				wg.Go(func() { calls[i] = invokeRaw(context.Background(), conn, chargeName, "race-1", amountReq(7)) })
			}
			wg.Wait()
			if p.runs.Load() != 1 || overlaps.Load() != 0 {
				t.Fatalf("runs %d, overlapping %d", p.runs.Load(), overlaps.Load())
			}
			for i, c := range calls {
				if c.err != nil || !bytes.Equal(c.raw, calls[0].raw) {
					t.Fatalf("call %d: %v, %x want %x", i, c.err, c.raw, calls[0].raw)
				}
			}
		})
	}
}

// TestTrialStoreGoesAway: a private Redis killed while the handler runs:
// the client still gets the handler's response (the key could not be
// stored; design.md section 5). Killed before a call: the retrying client
// gets Unavailable with RetryInfo, the handler does not run, and once the
// server is back (empty, its scripts gone) the retry with the same key
// runs the handler once.
func TestTrialStoreGoesAway(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{})
	p := &payments{}
	p.fn = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if n == 1 {
			srv.Kill()
		}
		return chargeResponse(ctx, req, n)
	}
	refused := make(chan struct{}, 1)
	watch := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if grpcx.Reason(err) == grpcx.ReasonStoreUnavailable {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
		return resp, err
	}
	conn := serve(t, p, serveOpts{
		interceptors: []grpc.UnaryServerInterceptor{watch, grpcx.UnaryServerInterceptor(g, guardOpts(t, grpcx.Options{UnavailableRetryDelay: 200 * time.Millisecond}))},
		client:       []grpc.UnaryClientInterceptor{grpcx.UnaryClientInterceptor(grpcx.ClientOptions{MaxAttempts: 50})},
	})
	ctx := context.Background()
	start := time.Now()
	if c := charge(ctx, conn, "gone-1", 1); c.err != nil || p.runs.Load() != 1 {
		t.Fatalf("store killed mid-handler: %v, runs %d", c.err, p.runs.Load())
	}
	t.Logf("response with the store killed mid-handler after %s", time.Since(start))

	done := make(chan call, 1)
	go func() { done <- charge(ctx, conn, "gone-2", 2) }()
	<-refused
	srv.Restart()
	c := <-done
	if c.err != nil || c.replayed() || p.runs.Load() != 2 {
		t.Fatalf("after the restart: %v replayed %v, runs %d", c.err, c.replayed(), p.runs.Load())
	}
	if c := charge(ctx, conn, "gone-2", 2); c.err != nil || !c.replayed() || p.runs.Load() != 2 {
		t.Fatalf("retry after the restart: %v replayed %v, runs %d", c.err, c.replayed(), p.runs.Load())
	}
}
