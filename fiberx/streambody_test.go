package fiberx_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestStreamedRequestBody: with Fiber's StreamRequestBody, fasthttp
// calls the handlers before a chunked body (or one past BodyLimit) has
// arrived, and the guard reads it as a stream. As under net/http:
//   - a body cut off (the client went away mid-body) is unreadable: 400,
//     nothing stored, the handler not run. fasthttp would give the
//     handler, and the fingerprint, its error's text as the body, and the
//     client's retry with the whole body would meet that record (422);
//   - a body past MaxBody is answered 413 once MaxBody is passed, not
//     after reading the rest into memory (a client that never ends its
//     body would hold the guard for ever);
//   - a whole body is what the fingerprint and the handler see.
//
// The same with a Tenant written for net/http, which gets the request
// converted, body and all, before the guard reads the body.
func TestStreamedRequestBody(t *testing.T) {
	t.Run("SingleCaller", func(t *testing.T) {
		testStreamedRequestBody(t, httpx.Options{SingleCaller: true, MaxBody: 4096})
	})
	t.Run("net/http Tenant", func(t *testing.T) {
		tenant := func(r *http.Request) string { return "account-" + r.Header.Get("Host") }
		testStreamedRequestBody(t, httpx.Options{Tenant: tenant, MaxBody: 4096})
	})
}

func testStreamedRequestBody(t *testing.T, o httpx.Options) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := fiber.New(fiber.Config{StreamRequestBody: true, BodyLimit: 1024})
	opts := fiberx.Options{Options: o}
	app.Post("/pay", fiberx.Guard(g, opts), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusCreated).SendString("got " + strconv.Quote(string(c.Body())))
	})
	base := listen(t, app)
	addr := strings.TrimPrefix(base, "http://")
	// send writes a chunked request with body chunks, then closes its
	// side when end is false (the client left), and reads the answer.
	send := func(key string, chunks []string, end, closeWrite bool, tail string) (int, string) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var b strings.Builder
		b.WriteString("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key + "\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, c := range chunks {
			b.WriteString(strconv.FormatInt(int64(len(c)), 16) + "\r\n" + c + "\r\n")
		}
		if end {
			b.WriteString("0\r\n\r\n")
		}
		b.WriteString(tail)
		if _, err := io.WriteString(conn, b.String()); err != nil {
			t.Fatal(err)
		}
		if closeWrite {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound on a failure, not a synchronisation
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("key %s: no answer: %v", key, err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}

	// Cut off: the client sent part of a chunk of its body, then went
	// away. (Cut off between chunks, fasthttp's stream ends as if whole:
	// the handler gets what came, without the guard as with it.)
	if c, b := send("cut", nil, false, true, "b\r\nhello"); c != http.StatusBadRequest || runs.Load() != 0 {
		t.Errorf("body cut off: %d %q, runs %d; want 400 and no run", c, b, runs.Load())
	}
	if c, b := send("cut", []string{"hello", " world"}, true, false, ""); c != http.StatusCreated || b != `got "hello world"` {
		t.Errorf("retry with the whole body: %d %q; want it run", c, b)
	}
	// Past MaxBody, the rest never sent.
	if c, b := send("big", []string{strings.Repeat("x", 4097)}, false, false, ""); c != http.StatusRequestEntityTooLarge {
		t.Errorf("body past MaxBody: %d %q; want 413", c, b)
	}
	// Whole, past BodyLimit but within MaxBody, twice: replayed.
	big := strings.Repeat("y", 3000)
	c1, b1 := send("whole", []string{big[:1000], big[1000:]}, true, false, "")
	c2, b2 := send("whole", []string{big}, true, false, "")
	if c1 != http.StatusCreated || b1 != "got "+strconv.Quote(big) || c2 != c1 || b2 != b1 {
		t.Errorf("whole body: %d %.40q then %d %.40q", c1, b1, c2, b2)
	}
	if runs.Load() != 2 {
		t.Errorf("runs %d, want 2", runs.Load())
	}
}

// TestStreamedRequestBodyCutShort: with StreamRequestBody, fasthttp reads
// at most 8 KiB of a body with a Content-Length before the handlers run
// and leaves the rest as a stream, which ends with io.EOF when the client
// goes away, short of the declared length, as if the body were whole. The
// guard answers 400 (nothing stored, the handler not run), as net/http's
// body does (io.ErrUnexpectedEOF): otherwise the handler ran with part of
// the body, its answer was stored, and the client's retry with the whole
// body met that record (422), its effect never made.
func TestStreamedRequestBodyCutShort(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := fiber.New(fiber.Config{StreamRequestBody: true})
	app.Post("/pay", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusCreated).SendString("got " + strconv.Itoa(len(c.Body())))
	})
	addr := strings.TrimPrefix(listen(t, app), "http://")
	// send declares a body of declared bytes, sends sent of them and
	// closes its side, and reads the answer.
	send := func(key string, declared, sent int) (int, string) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		req := "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key + "\r\nContent-Length: " + strconv.Itoa(declared) + "\r\n\r\n" +
			strings.Repeat("z", sent)
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		_ = conn.(*net.TCPConn).CloseWrite()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound on a failure, not a synchronisation
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("key %s: no answer: %v", key, err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	if c, b := send("cut", 20000, 10000); c != http.StatusBadRequest || runs.Load() != 0 {
		t.Fatalf("body cut off short of its length: %d %q, runs %d; want 400 and no run", c, b, runs.Load())
	}
	if c, b := send("cut", 20000, 20000); c != http.StatusCreated || b != "got 20000" || runs.Load() != 1 {
		t.Fatalf("retry with the whole body: %d %q, runs %d; want it run once", c, b, runs.Load())
	}
}
