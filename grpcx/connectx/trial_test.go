package connectx_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/internal/testenv"
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

// TestClientDeadlinesRaceOneKey: 32 calls with one key, each with its own
// deadline (most short), through the retrying client, while the handler (40 ms,
// finishing its effect whatever its context says) runs: it runs once, never
// two at a time, and a later call with the key gets its response.
func TestClientDeadlinesRaceOneKey(t *testing.T) {
	var inside, overlaps atomic.Int64
	p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer inside.Add(-1)
		time.Sleep(40 * time.Millisecond) // the effect, which does not stop when the client leaves
		return response(req, n)
	}}
	srv := serve(t, p, connectx.NewInterceptor(newGuard(t, ""), guardOpts(t, connectx.Options{})))
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	if _, err := c.CallUnary(context.Background(), amountReq(3, "warm-up")); err != nil { // the TLS connection, made once
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			// Deadlines of 5 to 51 ms, and 2 s for the last 8 calls, so that
			// some call reaches the handler on a loaded machine too (at
			// make test's load every call of 5-67 ms once ended first).
			d := time.Duration(5+2*i) * time.Millisecond
			if i >= 24 {
				d = 2 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			_, _ = c.CallUnary(ctx, amountReq(3, "dl-1"))
		})
	}
	wg.Wait()
	if p.runs.Load() != 2 {
		t.Fatalf("no call of the race reached the handler (runs %d)", p.runs.Load())
	}
	var res *connect.Response[structpb.ListValue]
	var err error
	testenv.WaitFor(t, 10*time.Second, "the key's response", func() bool {
		res, err = c.CallUnary(context.Background(), amountReq(3, "dl-1"))
		return err == nil
	})
	if p.runs.Load() != 2 || overlaps.Load() != 0 || !replayed(res.Header()) {
		t.Fatalf("runs %d, overlapping %d, replayed %v", p.runs.Load(), overlaps.Load(), replayed(res.Header()))
	}
}

// TestClientPushback: grpc-retry-pushback-ms in the error's metadata,
// over each protocol, is honoured: negative stops the retries at once, as
// gRFC A6 says; a number of milliseconds is waited.
func TestClientPushback(t *testing.T) {
	for _, proto := range []struct {
		name string
		opt  connect.ClientOption
	}{{"connect", connect.WithProtoJSON()}, {"grpc", connect.WithGRPC()}, {"grpcweb", connect.WithGRPCWeb()}} {
		for _, tc := range []struct {
			pushback string
			calls    int64
			atLeast  time.Duration
		}{{"-1", 1, 0}, {"40", 3, 80 * time.Millisecond}} {
			t.Run(proto.name+"/"+tc.pushback, func(t *testing.T) {
				p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
					if n < 3 {
						ce := connect.NewError(connect.CodeUnavailable, errors.New("shed"))
						ce.Meta().Set("Grpc-Retry-Pushback-Ms", tc.pushback)
						return nil, ce
					}
					return response(req, n)
				}}
				srv := serve(t, p)
				c := newClient(srv, proto.opt, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Millisecond})))
				start := time.Now()
				_, err := c.CallUnary(context.Background(), amountReq(1, ""))
				if p.runs.Load() != tc.calls || (tc.calls == 3) != (err == nil) {
					t.Fatalf("%v after %d calls, want %d", err, p.runs.Load(), tc.calls)
				}
				if took := time.Since(start); took < tc.atLeast {
					t.Fatalf("two retries after a pushback of %s ms took %s", tc.pushback, took)
				}
			})
		}
	}
}

// TestBadKeysRaw: keys sent by hand over the Connect protocol: two header
// lines, an empty one, one over MaxKeyLen, one with a tab or a byte past
// ASCII are refused with invalid_argument and ReasonKeyMalformed, and the
// handler never runs; the longest key is fine.
func TestBadKeysRaw(t *testing.T) {
	p := &payments{}
	srv := serve(t, p, connectx.NewInterceptor(newGuard(t, ""), guardOpts(t, connectx.Options{})))
	post := func(keys ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+charge, strings.NewReader(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for _, k := range keys {
			req.Header.Add("idempotency-key", k)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for name, keys := range map[string][]string{
		"two":      {"a", "b"},
		"empty":    {""},
		"too long": {strings.Repeat("k", maxKeyLen+1)},
		"tab":      {"a\tb"},
		"UTF-8":    {"clé"},
	} {
		code, body := post(keys...)
		if code != http.StatusBadRequest || !strings.Contains(body, `"invalid_argument"`) || !strings.Contains(body, "IDEMPOTENCY_KEY_MALFORMED") {
			t.Errorf("%s: %d %s", name, code, body)
		}
	}
	if p.runs.Load() != 0 {
		t.Fatalf("runs %d, want 0", p.runs.Load())
	}
	if code, body := post(strings.Repeat("k", maxKeyLen)); code != http.StatusOK || p.runs.Load() != 1 {
		t.Fatalf("longest key: %d %s, runs %d", code, body, p.runs.Load())
	}
}

// maxKeyLen is grpcx.MaxKeyLen (connectx does not link grpcx).
const maxKeyLen = 255
