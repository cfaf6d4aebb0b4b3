package grpcx_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx"
)

// TestClientRefusalIsTold: a call the client interceptor refuses to send
// (a malformed key from the context, ClientOptions.NewKey failing) is told
// as httpx.Transport's and connectx's refusals are: by its code, by
// errors.Is (ErrMalformedKey is "returned (wrapped)"; NewKey's own error
// is kept) and, for the malformed key, by Reason, as the server's refusal
// of such a key is (its code alone is also a server's InvalidArgument).
func TestClientRefusalIsTold(t *testing.T) {
	invoked := 0
	invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		invoked++
		return nil
	}

	ic := grpcx.UnaryClientInterceptor(grpcx.ClientOptions{})
	err := ic(grpcx.WithIdempotencyKey(context.Background(), "a key"), "/svc/M", nil, nil, nil, invoker)
	if invoked != 0 {
		t.Fatalf("a malformed key was sent (%d calls)", invoked)
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("code %s, want InvalidArgument", status.Code(err))
	}
	if !errors.Is(err, grpcx.ErrMalformedKey) {
		t.Errorf("errors.Is(err, grpcx.ErrMalformedKey) = false for %v", err)
	}
	if r := grpcx.Reason(err); r != grpcx.ReasonKeyMalformed {
		t.Errorf("Reason(err) = %q, want %q: as the server's refusal of such a key", r, grpcx.ReasonKeyMalformed)
	}

	errKeys := errors.New("key source down")
	ic = grpcx.UnaryClientInterceptor(grpcx.ClientOptions{NewKey: func() (string, error) { return "", errKeys }})
	err = ic(context.Background(), "/svc/M", nil, nil, nil, invoker)
	if !errors.Is(err, errKeys) {
		t.Errorf("errors.Is(err, NewKey's error) = false for %v", err)
	}
}
