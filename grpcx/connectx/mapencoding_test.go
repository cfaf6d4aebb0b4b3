package connectx_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// serveQuote starts a Charge that answers with a google.protobuf.Struct of
// 16 fields (a map), behind the guard, with the handler options given.
func serveQuote(t *testing.T, opts ...connect.HandlerOption) *httptest.Server {
	t.Helper()
	g := newGuard(t, "")
	h := func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		fields := map[string]any{}
		for i := range 16 {
			fields[fmt.Sprintf("line-%02d", i)] = float64(i)
		}
		msg, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(msg), nil
	}
	mux := http.NewServeMux()
	mux.Handle(charge, connect.NewUnaryHandler(charge, h, append(opts,
		connect.WithInterceptors(connectx.NewInterceptor(g, guardOpts(t, connectx.Options{}))))...))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	return srv
}

// postRaw sends Charge over Connect's unary protocol with the binary codec
// and returns the response body: the message's bytes on the wire.
func postRaw(t *testing.T, srv *httptest.Server, key string) ([]byte, http.Header) {
	t.Helper()
	msg, _ := proto.Marshal(amountReq(7, "").Msg)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+charge, bytes.NewReader(msg))
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set(connectx.DefaultHeader, key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	return b, resp.Header
}

// TestReplayMapBytes: a replayed response is the first response's message;
// its bytes on the wire are the first response's when the codec encodes
// deterministically. connect-go's binary codec writes map entries in Go's
// random map order (proto.Marshal), the handler's own response's as a
// replay's, so with it a message holding a map comes back equal but not
// always in the same bytes: the doc said "the same bytes on the wire", and
// ten replays of a 16-entry Struct differed from the first in order.
func TestReplayMapBytes(t *testing.T) {
	t.Run("default codec: the same message", func(t *testing.T) {
		srv := serveQuote(t)
		first, _ := postRaw(t, srv, "map-1")
		want := &structpb.Struct{}
		if err := proto.Unmarshal(first, want); err != nil || len(want.GetFields()) != 16 {
			t.Fatalf("first response %x: %v", first, err)
		}
		differ := 0
		for i := range 10 {
			b, h := postRaw(t, srv, "map-1")
			got := &structpb.Struct{}
			if err := proto.Unmarshal(b, got); err != nil || !replayed(h) || !proto.Equal(got, want) {
				t.Fatalf("repeat %d: %v (replayed %v, %v), want %v", i, got, replayed(h), err, want)
			}
			if !bytes.Equal(b, first) {
				differ++
			}
		}
		t.Logf("%d of 10 replays in another map order than the first response", differ)
	})
	t.Run("deterministic codec: the same bytes", func(t *testing.T) {
		srv := serveQuote(t, connect.WithCodec(deterministicCodec{}))
		first, _ := postRaw(t, srv, "map-2")
		for i := range 10 {
			b, h := postRaw(t, srv, "map-2")
			if !replayed(h) || !bytes.Equal(b, first) {
				t.Fatalf("repeat %d (replayed %v): %x, want the first response's bytes %x", i, replayed(h), b, first)
			}
		}
	})
}

// deterministicCodec is connect-go's binary codec ("proto") with map
// entries sorted, as the doc of connectx suggests for byte-identical
// replays.
type deterministicCodec struct{}

func (deterministicCodec) Name() string { return "proto" }

func (deterministicCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto.Message", m)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

func (deterministicCodec) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto.Message", m)
	}
	return proto.Unmarshal(b, pm)
}
