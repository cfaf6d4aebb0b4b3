package connectx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestClientRetryCodesNone: ClientOptions.RetryCodes set to an empty list
// retries no code, as grpcx's ClientOptions.RetryCodes does; only a nil
// list means the defaults.
func TestClientRetryCodesNone(t *testing.T) {
	p := &payments{fn: func(context.Context, *connect.Request[structpb.Struct], int64) (*connect.Response[structpb.ListValue], error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("transient"))
	}}
	srv := serve(t, p)
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{
		RetryCodes: []connect.Code{}, BaseDelay: time.Millisecond})))
	_, err := c.CallUnary(context.Background(), amountReq(1, ""))
	if connect.CodeOf(err) != connect.CodeUnavailable || p.runs.Load() != 1 {
		t.Fatalf("RetryCodes empty: %v after %d calls, want Unavailable after 1", err, p.runs.Load())
	}
}
