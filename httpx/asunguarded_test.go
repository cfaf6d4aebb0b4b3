package httpx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// wire is what a client sees of a response, less Date and
// Idempotent-Replayed.
type wire struct {
	status  int
	header  http.Header
	body    string
	trailer http.Header
	length  int64
	te      []string
}

func fetch(t *testing.T, c *http.Client, url, key string) wire {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader("a"))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	w := roundTrip(t, c, req)
	w.trailer = sentTrailers(w.trailer)
	return w
}

// roundTrip sends req and returns what came back, less the fields that
// differ between a first response and its replay by design (Date,
// Idempotent-Replayed).
func roundTrip(t *testing.T, c *http.Client, req *http.Request) wire {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	h := resp.Header.Clone()
	h.Del("Date")
	h.Del(httpx.ReplayedHeader)
	return wire{resp.StatusCode, h, string(b), resp.Trailer, resp.ContentLength, resp.TransferEncoding}
}

// sentTrailers is trailer less the names a Trailer field declared that
// no trailer came for (the client lists them without values).
func sentTrailers(trailer http.Header) http.Header {
	out := http.Header{}
	for k, vs := range trailer {
		if vs != nil {
			out[k] = vs
		}
	}
	return out
}

// TestGuardedAsUnguarded: a guarded handler's response, and its replay,
// are on the wire what the handler sends without the Guard: status, header
// fields (Content-Type and Content-Length included), body, trailers and
// framing. The capture sniffed a Content-Type from the first write alone
// (net/http sniffs what it buffered before sending) and sniffed one for a
// body with a Content-Encoding (net/http does not), so the guarded
// responses differed from the handler's. Each case runs over HTTP/1.1 and
// HTTP/2, and both sit behind the same outer middleware (fixedOuter). A
// replay brought back a field of that middleware which the handler
// removed, and sniffed a Content-Type for a body that went out without one
// (flushed before the body, or the field set to nil); the first response
// had neither. A field the handler set to an empty value (net/http sends
// it empty) was stored as a removal and replayed as absent. A trailer of
// the header the status went with that the handler deleted afterwards
// went out on the first response (the header is restored for the status).
func TestGuardedAsUnguarded(t *testing.T) {
	cases := map[string]http.HandlerFunc{
		"written in pieces": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "\n")
			io.WriteString(w, "<html><body>hi</body></html>")
		},
		"encoded, no type": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "identity")
			io.WriteString(w, "<html>encoded</html>")
		},
		"empty first write": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "")
			io.WriteString(w, "<html>hi</html>")
		},
		"status then body": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "<html>created</html>")
		},
		"content length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		},
		"early hints": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("X-Final", "1")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		},
		"http.Error":    func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad thing", http.StatusTeapot) },
		"nothing":       func(w http.ResponseWriter, r *http.Request) {},
		"204 with body": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204); io.WriteString(w, "x") },
		"304": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"a"`)
			w.WriteHeader(http.StatusNotModified)
		},
		"field after body": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "x")
			w.Header().Set("X-After", "1")
		},
		"flush before the body": func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
			io.WriteString(w, "<html>flushed</html>")
		},
		"empty write, flush, body": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "")
			w.(http.Flusher).Flush()
			io.WriteString(w, "<html>flushed</html>")
		},
		"type suppressed": func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			io.WriteString(w, "<html>untyped</html>")
		},
		"empty value": func(w http.ResponseWriter, r *http.Request) {
			w.Header()["X-Empty"] = []string{""}
			io.WriteString(w, "x")
		},
		"outer field emptied": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Outer", "")
			io.WriteString(w, "x")
		},
		"empty type": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "")
			io.WriteString(w, "<html>x</html>")
		},
		"outer field deleted": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del("X-Outer")
			io.WriteString(w, "x")
		},
		"content length, prefixed trailer": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4")
			io.WriteString(w, "body")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
		},
		"flush, prefixed trailer": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "body")
			w.(http.Flusher).Flush()
			w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
		},
		"redirect": func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusSeeOther) },
		"prefixed trailer after a big body": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, strings.Repeat("b", 3000))
			w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
		},
		"prefixed trailer before the status": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(http.TrailerPrefix+"X-Sum", "0")
			io.WriteString(w, "body")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
		},
		"prefixed trailer deleted": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(http.TrailerPrefix+"X-Sum", "0")
			io.WriteString(w, "body")
			w.Header().Del(http.TrailerPrefix + "X-Sum")
		},
		"declared trailer deleted": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("X-Sum", "0")
			io.WriteString(w, "body")
			w.Header().Del("X-Sum")
		},
		"trailers": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "1")
		},
	}
	// The replays of the streamed cases, and of those whose trailers the
	// handler deleted (net/http sends the first chunked, for trailers it
	// then has none of), are not held to the framing.
	streamed := map[string]bool{"flush before the body": true, "empty write, flush, body": true, "flush, prefixed trailer": true,
		"prefixed trailer deleted": true, "declared trailer deleted": true}
	asUnguarded(t, fixedOuter, streamed, cases)
}

// TestGuardedAsUnguardedOuterType: TestGuardedAsUnguarded behind outer
// middleware that sets a Content-Type the handler removes. net/http sniffs
// a type for the body; the capture stored it only for a body written
// without a status, so after an explicit status a replay carried the outer
// middleware's type instead.
func TestGuardedAsUnguardedOuterType(t *testing.T) {
	typed := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			next.ServeHTTP(w, r)
		})
	}
	asUnguarded(t, typed, map[string]bool{"removed, flushed": true}, map[string]http.HandlerFunc{
		"removed, status then body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del("Content-Type")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "<html>created</html>")
		},
		"removed, body": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del("Content-Type")
			io.WriteString(w, "<html>x</html>")
		},
		"removed, flushed": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del("Content-Type")
			w.WriteHeader(http.StatusCreated)
			w.(http.Flusher).Flush()
			io.WriteString(w, "<html>x</html>")
		},
		"kept": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "<html>x</html>")
		},
		"removed, 204": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del("Content-Type")
			w.WriteHeader(http.StatusNoContent)
		},
	})
}

// asUnguarded checks each handler's response, guarded and on replay,
// against the response without the Guard, behind the same outer
// middleware, over HTTP/1.1 and HTTP/2. The replays of the streamed cases
// (flushed) are not held to the framing.
func asUnguarded(t *testing.T, outer func(http.Handler) http.Handler, streamed map[string]bool, cases map[string]http.HandlerFunc) {
	t.Helper()
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for name, h := range cases {
		for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
			t.Run(name+" "+proto, func(t *testing.T) {
				e := newEnv(t, guard.Options{})
				serve := serve
				if proto == "HTTP/2" {
					serve = serveH2
				}
				plain, pc := serve(t, outer(h))
				srv, c := serve(t, outer(guarded(e, h, httpx.Options{})))
				pc.CheckRedirect, c.CheckRedirect = noRedirect, noRedirect
				want := fetch(t, pc, plain.URL+"/o", "")
				for i, got := range []wire{fetch(t, c, srv.URL+"/o", "w-1"), fetch(t, c, srv.URL+"/o", "w-1")} {
					if i == 1 && streamed[name] {
						// A replay does not flush: its framing is its own.
						got.length, got.te = want.length, want.te
						got.header.Del("Content-Length")
						if cl, ok := want.header["Content-Length"]; ok {
							got.header["Content-Length"] = cl
						}
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("response %d (1: the replay):\n got %+v\nwant %+v", i, got, want)
					}
				}
			})
		}
	}
}

// fixedOuter is middleware in front of the handler (and of the Guard): it
// sets a field of its own on every response.
func fixedOuter(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Outer", "1")
		next.ServeHTTP(w, r)
	})
}

// serveH2 is serve over TLS with HTTP/2.
func serveH2(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	c := srv.Client()
	t.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	return srv, c
}
