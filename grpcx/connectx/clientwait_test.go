package connectx_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// endingCtx is a context that ends, with err, the first time its deadline
// is asked for once armed: the client interceptor asks right before it
// waits to retry, so the context ends during that wait, never during an
// attempt.
type endingCtx struct {
	context.Context
	err   error
	armed atomic.Bool
	once  sync.Once
	done  chan struct{}
	mu    sync.Mutex
	ended error
}

func newEndingCtx(err error) *endingCtx {
	return &endingCtx{Context: context.Background(), err: err, done: make(chan struct{})}
}

func (c *endingCtx) Deadline() (time.Time, bool) {
	if c.armed.Load() {
		c.once.Do(func() {
			c.mu.Lock()
			c.ended = c.err
			c.mu.Unlock()
			close(c.done)
		})
	}
	return time.Time{}, false
}

func (c *endingCtx) Done() <-chan struct{} { return c.done }

func (c *endingCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// TestClientContextEndsWhileWaiting: a call whose context ends while the
// client interceptor waits to retry fails at once with Canceled or
// DeadlineExceeded, as an attempt cut short does and as grpcx's client
// answers: not Unknown, which is what connect.CodeOf gives a context's
// error.
func TestClientContextEndsWhileWaiting(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{context.Canceled, connect.CodeCanceled},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			p := &payments{fn: func(context.Context, *connect.Request[structpb.Struct], int64) (*connect.Response[structpb.ListValue], error) {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("down"))
			}}
			srv := serve(t, p)
			ctx := newEndingCtx(tc.err)
			arm := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
				return func(ctx2 context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
					res, err := next(ctx2, req)
					ctx.armed.Store(true) // the attempt is over: end the context in the wait
					return res, err
				}
			})
			c := newClient(srv, connect.WithInterceptors(
				connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Hour, MaxDelay: time.Hour}), arm))
			start := time.Now()
			_, err := c.CallUnary(ctx, amountReq(1, ""))
			if connect.CodeOf(err) != tc.want || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), "waiting to retry") {
				t.Fatalf("%v (code %v); want %v from the wait", err, connect.CodeOf(err), tc.want)
			}
			if p.runs.Load() != 1 || time.Since(start) > 10*time.Second {
				t.Fatalf("%d attempts, %s", p.runs.Load(), time.Since(start))
			}
		})
	}
}
