package httpx_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's guard on the shared real Redis, under its own prefix.
type env struct {
	t        testing.TB
	rdb      *redis.Client
	store    *guard.RedisStore
	g        *guard.Guard
	prefix   string
	commands *commandCounter
}

func newEnv(t testing.TB, opts guard.Options) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	cc := &commandCounter{}
	rdb.AddHook(cc)
	prefix := testenv.Prefix(t)
	store := guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: prefix})
	return &env{t: t, rdb: rdb, store: store, g: guard.New(store, opts), prefix: prefix, commands: cc}
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

// commandCounter is a go-redis hook that counts every command sent.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// serve starts h on a loopback server and returns it with a client of its
// own; both are closed when the test ends.
func serve(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(h)
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	return srv, &http.Client{Transport: tr}
}

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) replayed() bool { return r.header.Get(httpx.ReplayedHeader) == "true" }

func (r reply) problem(t *testing.T) httpx.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != httpx.ProblemContentType {
		t.Fatalf("Content-Type %q, want %q (status %d, body %q)", ct, httpx.ProblemContentType, r.status, r.body)
	}
	var p httpx.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.status)
	}
	return p
}

// do sends method url with body and the given header pairs, and reads the
// whole response.
func do(t *testing.T, c *http.Client, method, url, body string, header ...string) reply {
	t.Helper()
	r, err := send(context.Background(), c, method, url, body, header...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func send(ctx context.Context, c *http.Client, method, url, body string, header ...string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// key is the header pair for an idempotency key.
func key(k string) []string { return []string{"Idempotency-Key", k} }

func with(pairs ...[]string) []string {
	var out []string
	for _, p := range pairs {
		out = append(out, p...)
	}
	return out
}
