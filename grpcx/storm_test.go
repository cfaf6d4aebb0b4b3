package grpcx_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestStorm: 1,000 keys × 8 copies over two servers, each with its own
// Redis client, store and guard on one real Redis, through the client
// interceptor, 256 calls in flight; the copies of a key go alternately to
// the two servers. Each key's effect (5 ms) happens exactly once, and
// every copy gets the same response. With the defaults, duplicates are
// answered Aborted and ask again after the RetryInfo delay; with Wait they
// wait on the server.
func TestStorm(t *testing.T) {
	const keys, copies, inFlight = 1000, 8, 256
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{{"defaults", 0}, {"Wait", 10 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := testenv.Prefix(t)
			var effects [keys]atomic.Int64
			var aborted atomic.Int64
			countAborted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				resp, err := h(ctx, req)
				if grpcx.Reason(err) == grpcx.ReasonKeyInUse {
					aborted.Add(1)
				}
				return resp, err
			}
			var conns []*grpc.ClientConn
			for range 2 {
				store := guardenv.Store(t, guard.RedisOptions{Prefix: prefix})
				g := guard.New(store, guard.Options{})
				p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
					k := int(req.GetFields()["order"].GetNumberValue())
					effects[k].Add(1)
					time.Sleep(5 * time.Millisecond) // the effect itself
					return chargeResponse(ctx, req, n)
				}}
				conns = append(conns, serve(t, p, serveOpts{
					tcp:          true,
					interceptors: []grpc.UnaryServerInterceptor{countAborted, grpcx.UnaryServerInterceptor(g, guardOpts(t, grpcx.Options{Wait: tc.wait}))},
					client:       []grpc.UnaryClientInterceptor{grpcx.UnaryClientInterceptor(grpcx.ClientOptions{MaxAttempts: 10})},
				}))
			}
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			answers := make([][]*structpb.ListValue, keys)
			for k := range answers {
				answers[k] = make([]*structpb.ListValue, copies)
			}
			took := make([]time.Duration, keys*copies)
			jobs := make(chan int)
			var wg sync.WaitGroup
			start := time.Now()
			for range inFlight {
				wg.Go(func() {
					for j := range jobs {
						k, cp := j/copies, j%copies
						req, _ := structpb.NewStruct(map[string]any{"order": float64(k), "amount": 100.0})
						t0 := time.Now()
						c := invoke(context.Background(), conns[cp%2], chargeName, run+"-"+strconv.Itoa(k), req)
						took[j] = time.Since(t0)
						if c.err != nil {
							t.Errorf("key %d copy %d: %v", k, cp, c.err)
						}
						answers[k][cp] = c.resp
					}
				})
			}
			for j := range keys * copies {
				jobs <- j
			}
			close(jobs)
			wg.Wait()
			total := time.Since(start)
			var twice, wrong int
			for k := range keys {
				if effects[k].Load() != 1 {
					twice++
					if twice <= 5 {
						t.Errorf("key %d: %d effects", k, effects[k].Load())
					}
				}
				for _, a := range answers[k][1:] {
					if !proto.Equal(a, answers[k][0]) {
						wrong++
					}
				}
			}
			slices.Sort(took)
			t.Logf("%d keys × %d copies, %d in flight, 5 ms effect, Wait %s: Aborted answers %d; call p50 %s p99 %s slowest %s; all %s",
				keys, copies, inFlight, tc.wait, aborted.Load(), took[len(took)/2].Round(100*time.Microsecond),
				took[len(took)*99/100].Round(100*time.Microsecond), took[len(took)-1].Round(time.Millisecond), total.Round(time.Millisecond))
			if twice != 0 || wrong != 0 {
				t.Fatalf("%d keys whose effect did not happen exactly once; %d answers differ from their key's first", twice, wrong)
			}
			if tc.wait > 0 && aborted.Load() != 0 {
				t.Errorf("with Wait, %d answers were Aborted", aborted.Load())
			}
		})
	}
}
