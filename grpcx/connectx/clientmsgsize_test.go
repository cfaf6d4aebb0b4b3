package connectx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestClientMessageSizeNotRetried: connect-go's message-size limits
// answer CodeResourceExhausted, which the client interceptor retries by
// default, but no retry gets under them (the same request is as large,
// the guard replays the same response). A response over the client's
// WithReadMaxBytes and a request over its WithSendMaxBytes are returned
// after one attempt, as grpcx's interceptor does.
func TestClientMessageSizeNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  connect.ClientOption
		runs int64
	}{
		{"response over WithReadMaxBytes", connect.WithReadMaxBytes(16), 1},
		{"request over WithSendMaxBytes", connect.WithSendMaxBytes(8), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &payments{}
			srv := serve(t, p)
			c := newClient(srv, tc.opt, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Millisecond})))
			_, err := c.CallUnary(context.Background(), amountReq(1, ""))
			if ce, ok := errors.AsType[*connect.Error](err); !ok || ce.Code() != connect.CodeResourceExhausted {
				t.Fatalf("got %v, want connect-go's CodeResourceExhausted for the size", err)
			}
			if n := p.runs.Load(); n > tc.runs {
				t.Fatalf("%d runs, want at most %d: %v", n, tc.runs, err)
			}
		})
	}
}
