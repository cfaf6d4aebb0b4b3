package grpcx_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The test service: idemguard.test.Payments, without generated code. Its
// requests are google.protobuf.Struct, its responses ListValue (a message
// without maps, so its encoding is the same bytes every time).
const (
	service    = "idemguard.test.Payments"
	chargeName = "/" + service + "/Charge"
	getName    = "/" + service + "/Get"
)

// payments is the test service's implementation: it counts the runs of
// each method and answers each Charge with a response no other run gives.
// fn, when set, replaces Charge's default behaviour.
type payments struct {
	runs atomic.Int64
	gets atomic.Int64
	fn   func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error)
}

func (p *payments) charge(ctx context.Context, req *structpb.Struct) (*structpb.ListValue, error) {
	n := p.runs.Add(1)
	if p.fn != nil {
		return p.fn(ctx, req, n)
	}
	return chargeResponse(ctx, req, n)
}

// chargeResponse is Charge's default answer to run n: header and trailer
// metadata, and a list of the run number, the time and the amount.
func chargeResponse(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-charge", fmt.Sprint(n), "set-cookie", "session=secret")); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", fmt.Sprintf("entry-%d", n), "x-bin-bin", string([]byte{0, 1, 2, n8(n)}))); err != nil {
		return nil, err
	}
	return structpb.NewList([]any{float64(n), time.Now().Format(time.RFC3339Nano), req.GetFields()["amount"].GetNumberValue()})
}

func n8(n int64) byte { return byte(n) }

func (p *payments) get(ctx context.Context, req *structpb.Struct) (*structpb.ListValue, error) {
	p.gets.Add(1)
	return structpb.NewList([]any{"ok"})
}

func method[Req proto.Message](name string, newReq func() Req, fn func(context.Context, Req) (*structpb.ListValue, error)) grpc.MethodDesc {
	full := "/" + service + "/" + name
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := newReq()
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) { return fn(ctx, req.(Req)) }
		if interceptor == nil {
			return h(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}}
}

func newStruct() *structpb.Struct { return &structpb.Struct{} }

func (p *payments) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			method("Charge", newStruct, p.charge),
			method("Get", newStruct, p.get),
		},
	}
}

// env is one test's guard on the shared real Redis, under its own prefix.
type env struct {
	t      testing.TB
	rdb    *redis.Client
	store  *guard.RedisStore
	g      *guard.Guard
	prefix string
}

func newEnv(t testing.TB, opts guard.Options) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	store := guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: prefix})
	return &env{t: t, rdb: rdb, store: store, g: guard.New(store, opts), prefix: prefix}
}

// records counts the idempotency records under the test's prefix.
func (e *env) records(t *testing.T) int {
	t.Helper()
	n := 0
	iter := e.rdb.Scan(context.Background(), 0, e.prefix+"*", 10000).Iterator() // few round trips over a shared server's keys
	for iter.Next(context.Background()) {
		// A released first attempt leaves a marker that reads as absent.
		if _, err := e.store.GetByName(context.Background(), iter.Val()); err == nil {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan: %v", err)
	}
	return n
}

// guardOpts fills what every test needs: the Charge method guarded, a
// single caller unless the test names one, a logger that writes to t.Log.
func guardOpts(t testing.TB, opts grpcx.Options) grpcx.Options {
	if opts.Methods == nil {
		opts.Methods = []string{chargeName}
	}
	if opts.Caller == nil {
		opts.SingleCaller = true
	}
	if opts.Logger == nil {
		opts.Logger = testenv.Logger(t)
	}
	return opts
}

// serveOpts are a test server's parts: its interceptors and its listener.
type serveOpts struct {
	interceptors []grpc.UnaryServerInterceptor
	client       []grpc.UnaryClientInterceptor
	tcp          bool // a loopback TCP listener instead of bufconn
	// wrap, if set, wraps the listener (to see or drop connections).
	wrap func(net.Listener) net.Listener
}

// serve starts p's service on a grpc.Server with the interceptors, and
// returns a client connection to it; both end with the test.
func serve(t testing.TB, p *payments, so serveOpts) *grpc.ClientConn {
	t.Helper()
	return serveWith(t, p, so, p.desc())
}

// serveWith is serve with the service described by desc.
func serveWith(t testing.TB, p *payments, so serveOpts, desc *grpc.ServiceDesc) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(so.interceptors...))
	srv.RegisterService(desc, p)
	var (
		lis  net.Listener
		dial []grpc.DialOption
		err  error
	)
	target := "passthrough:///bufnet"
	if so.tcp {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		target = lis.Addr().String()
	} else {
		bl := bufconn.Listen(1 << 20)
		lis = bl
		dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bl.DialContext(ctx) }))
	}
	if so.wrap != nil {
		lis = so.wrap(lis)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(so.client...))
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

// call is one answered call: its response, header, trailer and status.
type call struct {
	resp    *structpb.ListValue
	raw     []byte // the response's bytes on the wire, with invokeRaw
	header  metadata.MD
	trailer metadata.MD
	err     error
}

func (c call) replayed() bool {
	return len(c.header.Get(grpcx.ReplayedMetadata)) == 1 && c.header.Get(grpcx.ReplayedMetadata)[0] == "true"
}

// charge calls Charge with the amount and the key (none when "").
func charge(ctx context.Context, conn *grpc.ClientConn, key string, amount float64, opts ...grpc.CallOption) call {
	return invoke(ctx, conn, chargeName, key, amountReq(amount), opts...)
}

func amountReq(amount float64) *structpb.Struct {
	req, _ := structpb.NewStruct(map[string]any{"amount": amount, "currency": "eur"})
	return req
}

func invoke(ctx context.Context, conn *grpc.ClientConn, method, key string, req proto.Message, opts ...grpc.CallOption) call {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, grpcx.DefaultMetadata, key)
	}
	var c call
	c.resp = &structpb.ListValue{}
	c.err = conn.Invoke(ctx, method, req, c.resp, append(opts, grpc.Header(&c.header), grpc.Trailer(&c.trailer))...)
	return c
}

// invokeRaw is invoke that keeps the response's bytes as they came.
func invokeRaw(ctx context.Context, conn *grpc.ClientConn, method, key string, req proto.Message) call {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, grpcx.DefaultMetadata, key)
	}
	var c call
	c.err = conn.Invoke(ctx, method, req, &c.raw, grpc.ForceCodecV2(rawCodec{}), grpc.Header(&c.header), grpc.Trailer(&c.trailer))
	if c.err == nil {
		c.resp = &structpb.ListValue{}
		if err := proto.Unmarshal(c.raw, c.resp); err != nil {
			c.err = err
		}
	}
	return c
}

// rawCodec sends protobuf messages and receives bytes as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*[]byte)) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// recovery is a server interceptor that turns a handler's panic into
// Internal, as go-grpc-middleware's recovery does (grpc.Server itself
// lets a panic crash the process).
func recovery(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}
