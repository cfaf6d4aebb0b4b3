package connectx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestContextErrorCodes: a handler that returns a context's error as it
// is (or wrapped, not as a *connect.Error) is answered by Connect with
// Canceled or DeadlineExceeded. Options.Release is asked about that code,
// and a stored one replays with it: not Unknown, which is what
// connect.CodeOf gives a context error.
func TestContextErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{fmt.Errorf("ledger: %w", context.Canceled), connect.CodeCanceled},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			g := newGuard(t, "")
			p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
				return nil, tc.err
			}}
			var mu sync.Mutex
			var asked []connect.Code
			keep := func(c connect.Code) bool { // stores every code, and says which it was asked about
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, c)
				return false
			}
			srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Release: keep})))
			c := newClient(srv)
			_, err1 := c.CallUnary(context.Background(), amountReq(1, "c-1"))
			_, err2 := c.CallUnary(context.Background(), amountReq(1, "c-1"))
			if connect.CodeOf(err1) != tc.want {
				t.Fatalf("first call: %v; the test expects Connect to answer %v", err1, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(asked) != 1 || asked[0] != tc.want {
				t.Errorf("Release asked about %v; want [%v], the code the client got", asked, tc.want)
			}
			if ce, ok := errors.AsType[*connect.Error](err2); !ok || ce.Code() != tc.want || !replayed(ce.Meta()) || p.runs.Load() != 1 {
				t.Errorf("replay %v (replayed %v, runs %d); want %v replayed", err2, ok && replayed(ce.Meta()), p.runs.Load(), tc.want)
			}
		})
	}
}
