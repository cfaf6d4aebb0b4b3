package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestContentLengthOverrun: a handler that declares Content-Length 5,
// writes its 5 bytes and then, in a write of its own, a byte more (a
// trailing newline: a common slip) gets from net/http the refusal of that
// write alone (http.ErrContentLength) and the client the declared 5 bytes.
// Behind the Guard the same: the capture refuses the write as net/http
// does, and holds, stores and replays the body the client got (it held
// both writes and sent them as one, which net/http refused whole: the
// client and every replay got the status and no body).
func TestContentLengthOverrun(t *testing.T) {
	var secondWrite atomic.Value
	h := func(runs *atomic.Int64) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Length", "5")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "hello")
			_, err := io.WriteString(w, "\n")
			secondWrite.Store(errString(err))
		})
	}

	// Unguarded: the client gets the declared body.
	var plainRuns atomic.Int64
	plain, pc := serve(t, h(&plainRuns))
	want, err := send(t.Context(), pc, "POST", plain.URL+"/o", "a")
	if err != nil || want.status != http.StatusCreated || string(want.body) != "hello" {
		t.Fatalf("unguarded: %+v %v; want 201 %q", want, err, "hello")
	}
	if got := secondWrite.Load(); got != errString(http.ErrContentLength) {
		t.Fatalf("unguarded second write: %v, want %v", got, http.ErrContentLength)
	}

	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	srv, c := serve(t, guarded(e, h(&runs), httpx.Options{}))
	for i, label := range []string{"first response", "replay"} {
		got, err := send(t.Context(), c, "POST", srv.URL+"/o", "a", key("cl-over")...)
		if err != nil || got.status != http.StatusCreated || string(got.body) != "hello" {
			t.Errorf("%s (%d): status %d body %q err %v; want 201 %q, as the handler answers without the Guard",
				label, i, got.status, got.body, err, "hello")
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("guarded handler ran %d times, want 1", n)
	}
	if got := secondWrite.Load(); got != errString(http.ErrContentLength) {
		t.Errorf("guarded second write returned %v; net/http returns %v", got, http.ErrContentLength)
	}
}

// TestContentLengthInvalid: a Content-Length net/http does not accept
// (" 10": it parses the value as it is) is dropped, and the body goes out
// whole; the capture reads the field as net/http does, so the response is
// stored and replayed, not taken for one cut short (it trimmed the value,
// read 10, and every replay said the response was cut off).
func TestContentLengthInvalid(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Length", " 10")
		io.WriteString(w, "hello")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("cl-bad")...)
	if first.status != http.StatusOK || string(first.body) != "hello" {
		t.Fatalf("first response: %d %q, want 200 %q", first.status, first.body, "hello")
	}
	replay := do(t, c, "POST", srv.URL+"/o", "a", key("cl-bad")...)
	if replay.status != http.StatusOK || string(replay.body) != "hello" || !replay.replayed() {
		t.Errorf("replay: %d %q (replayed %v); want the response the client got, 200 %q, replayed",
			replay.status, replay.body, replay.replayed(), "hello")
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestTransferEncodingH2Sniffed: over HTTP/2 a handler that sets
// Transfer-Encoding itself (code written for HTTP/1.1) gets a sniffed
// Content-Type (the HTTP/2 server drops the field and sniffs as usual), and
// the replay has that type too (DefaultReplayHeader: "A replay has the
// Content-Type the first response had"); HTTP/1.1's rule, no sniffing
// with a Transfer-Encoding, stored it untyped.
func TestTransferEncodingH2Sniffed(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Transfer-Encoding", "chunked")
		io.WriteString(w, "<html>hi</html>")
	})
	srv, c := serveH2(t, guarded(e, h, httpx.Options{}))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("te-h2")...)
	replay := do(t, c, "POST", srv.URL+"/o", "a", key("te-h2")...)
	if !replay.replayed() {
		t.Fatalf("second response not a replay: %d %q", replay.status, replay.body)
	}
	ft, rt := first.header.Get("Content-Type"), replay.header.Get("Content-Type")
	if !strings.HasPrefix(ft, "text/html") {
		t.Fatalf("first response Content-Type %q, want net/http's sniffed text/html", ft)
	}
	if rt != ft {
		t.Errorf("replay Content-Type %q, first response had %q", rt, ft)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestContentLengthOverrunThenFits: after a write refused for passing the
// declared length, net/http refuses every later write too, even one that
// would fit (it counts the refused bytes): the client gets the body cut
// off, and so it does behind the Guard, which keeps the "cut short"
// marker, not a body net/http would never have sent.
func TestContentLengthOverrunThenFits(t *testing.T) {
	h := func(runs *atomic.Int64) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "hello")
			io.WriteString(w, "123456") // past 10: refused
			io.WriteString(w, "world")  // would fit: refused too
		})
	}
	var plainRuns atomic.Int64
	plain, pc := serve(t, h(&plainRuns))
	if got, err := send(t.Context(), pc, "POST", plain.URL+"/o", "a"); err == nil {
		t.Fatalf("unguarded: %d %q, want the body cut off (an error)", got.status, got.body)
	}
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	srv, c := serve(t, guarded(e, h(&runs), httpx.Options{}))
	if got, err := send(t.Context(), c, "POST", srv.URL+"/o", "a", key("cl-over-fit")...); err == nil {
		t.Fatalf("guarded: %d %q, want the body cut off, as unguarded", got.status, got.body)
	}
	replay := do(t, c, "POST", srv.URL+"/o", "a", key("cl-over-fit")...)
	if !replay.replayed() || !strings.Contains(string(replay.body), httpx.ProblemResponseNotKept) || runs.Load() != 1 {
		t.Errorf("replay: %d %q (replayed %v, %d runs); want the not-kept marker, one run", replay.status, replay.body, replay.replayed(), runs.Load())
	}
}
