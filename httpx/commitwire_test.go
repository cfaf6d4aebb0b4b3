package httpx_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestCommitResponseAsUnguarded: a response committed with
// httpx.CommitResponse, its replay from Redis and, once Redis forgot the
// key, its replay from PostgreSQL are on the wire what CommitResponse
// sends without the Guard: status, header fields (Content-Type and
// Content-Length present or not), body and framing. Each case runs over
// HTTP/1.1 and HTTP/2.
func TestCommitResponseAsUnguarded(t *testing.T) {
	cases := map[string]func(h http.Header, id int64) (int, []byte){
		"204":              func(h http.Header, id int64) (int, []byte) { return http.StatusNoContent, nil },
		"201 without body": func(h http.Header, id int64) (int, []byte) { return http.StatusCreated, nil },
		"201 typed, without body": func(h http.Header, id int64) (int, []byte) {
			h.Set("Content-Type", "application/json")
			return http.StatusCreated, nil
		},
		"200 empty body": func(h http.Header, id int64) (int, []byte) { return http.StatusOK, []byte{} },
		"sniffed":        func(h http.Header, id int64) (int, []byte) { return http.StatusOK, []byte("<html>ok</html>") },
		"type suppressed": func(h http.Header, id int64) (int, []byte) {
			h["Content-Type"] = nil
			return http.StatusOK, []byte("<html>ok</html>")
		},
		"prefixed trailer": func(h http.Header, id int64) (int, []byte) {
			h.Set(http.TrailerPrefix+"X-Sum", "1")
			return http.StatusCreated, []byte("body")
		},
		"empty value": func(h http.Header, id int64) (int, []byte) {
			h["X-Empty"] = []string{""}
			return http.StatusAccepted, nil
		},
	}
	for name, respond := range cases {
		for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
			t.Run(name+" "+proto, func(t *testing.T) {
				s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true})
				s.respond = respond
				serve := serve
				if proto == "HTTP/2" {
					serve = serveH2
				}
				plain, pc := serve(t, authenticate(http.HandlerFunc(s.charge)))
				srv, c := serve(t, s.handler)
				want := fetchCharge(t, pc, plain.URL, "")
				for i, what := range []string{"first", "replay from Redis", "replay from PostgreSQL"} {
					if i == 2 {
						s.forget(t, "cw-1")
					}
					got := fetchCharge(t, c, srv.URL, "cw-1")
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
					}
				}
				if rows, _ := s.rows(t); rows != 2 {
					t.Fatalf("%d charges, want 2 (one unguarded, one guarded)", rows)
				}
			})
		}
	}
}

// TestCommitResponseLateTrailer: a trailer the handler set after
// CommitResponse, which it did not commit, went out with the first
// response (net/http sends trailers from the header as the handler
// leaves it), so that replays lacked it. The response is sealed: it is
// not sent, and every replay, from Redis or PostgreSQL, is the first
// response.
func TestCommitResponseLateTrailer(t *testing.T) {
	s := newCharges(t, testenv.Redis(t), testenv.Prefix(t), chargesOptions{guarded: true})
	s.respond = func(h http.Header, id int64) (int, []byte) {
		h.Set(http.TrailerPrefix+"X-Sum", "1")
		return http.StatusCreated, []byte("body")
	}
	s.after = func(h http.Header) {
		h.Set(http.TrailerPrefix+"X-Late", "1")
		h.Set(http.TrailerPrefix+"X-Sum", "2")
	}
	srv, c := serve(t, s.handler)
	first := fetchCharge(t, c, srv.URL, "lt-1")
	if len(first.trailer) != 1 || first.trailer.Get("X-Sum") != "1" {
		t.Errorf("first response's trailers %v, want X-Sum: 1 only (the committed one)", first.trailer)
	}
	for i, what := range []string{"replay from Redis", "replay from PostgreSQL"} {
		if i == 1 {
			s.forget(t, "lt-1")
		}
		if got := fetchCharge(t, c, srv.URL, "lt-1"); !reflect.DeepEqual(got, first) {
			t.Errorf("%s:\n got %+v\nwant %+v", what, got, first)
		}
	}
}

// fetchCharge is fetch of POST /charges as the account "ada".
func fetchCharge(t *testing.T, c *http.Client, url, key string) wire {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/charges", strings.NewReader(`{"amount":500}`))
	req.Header.Set("Authorization", "Bearer tok-ada-1")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return roundTrip(t, c, req)
}
