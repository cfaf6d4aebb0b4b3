package httpcore

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestHeaderSnapshot: a snapshot keeps the header as http.Header.Clone
// would (values copied, so later changes to the header, even to a value
// in place, leave it be; nil values stay nil), restore puts exactly its
// fields back, and a header larger than the inline storage is kept whole.
func TestHeaderSnapshot(t *testing.T) {
	for _, fields := range []int{0, 1, snapFields, snapFields + 3} {
		h := http.Header{}
		for i := range fields {
			h["X-F"+strconv.Itoa(i)] = []string{"v" + strconv.Itoa(i), "w"} // more values than snapValues past 4 fields
		}
		if fields > 0 {
			h["X-Nil"] = nil
			h["X-Empty"] = []string{}
		}
		want := h.Clone()
		var s headerSnapshot
		s.take(h)
		for k := range h {
			if len(h[k]) > 0 {
				h[k][0] = "changed in place"
			}
			h[k] = append(h[k], "appended")
		}
		h.Set("X-Later", "1")
		got := http.Header{"X-Stale": {"gone"}}
		s.restore(got)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d fields: restored %v, want %v", fields, got, want)
		}
		if fields > 0 && (got["X-Nil"] != nil || got["X-Empty"] == nil) {
			t.Fatalf("%d fields: nil and empty values not kept apart: %#v %#v", fields, got["X-Nil"], got["X-Empty"])
		}
	}
}

// TestHotPathAllocations: what the capture and the body read cost, the
// figures TestMiddlewareAllocations (httpx) counts on: a snapshot of a
// typical response header costs nothing (the capture holds it), and a
// small declared body is read in one allocation shared with the r.Body
// the handler reads.
func TestHotPathAllocations(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}, "X-Multi": {"a", "b"}}
	var s headerSnapshot
	if n := testing.AllocsPerRun(100, func() { s.take(h) }); n != 0 {
		t.Errorf("snapshot of a 3-field header: %.1f allocations, want 0", n)
	}
	out := http.Header{}
	s.restore(out)
	if n := testing.AllocsPerRun(100, func() { s.restore(out) }); n != 0 {
		t.Errorf("restore: %.1f allocations, want 0", n)
	}

	const body = `{"sku":"tea","qty":1}`
	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	rd := strings.NewReader(body)
	w := httptest.NewRecorder()
	n := testing.AllocsPerRun(100, func() {
		rd.Reset(body)
		req.Body, req.ContentLength = io.NopCloser(rd), int64(len(body))
		if _, err := ReadHTTPBody(w, req, 1<<20); err != nil {
			t.Fatal(err)
		}
	})
	// io.NopCloser's wrapper is the test's own allocation.
	if n-1 > 1 {
		t.Errorf("reading a %d-byte body: %.1f allocations, want 1", len(body), n-1)
	}
}

// TestReadHTTPBody: the body comes back whole and readable again, at every
// size around the inline buffer and past it, declared or not, and with
// more bytes than declared; past max it is refused.
func TestReadHTTPBody(t *testing.T) {
	for _, size := range []int{0, 1, heldBodyInline - 1, heldBodyInline, heldBodyInline + 1, 5000, exactRead + 1} {
		for _, declared := range []int64{int64(size), -1, int64(size) - 1} {
			if declared < -1 {
				continue
			}
			want := bytes.Repeat([]byte("x"), size)
			req := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(bytes.NewReader(want)))
			req.ContentLength = declared
			got, err := ReadHTTPBody(httptest.NewRecorder(), req, 1<<20)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("size %d declared %d: %d bytes, %v", size, declared, len(got), err)
			}
			again, err := io.ReadAll(req.Body)
			if err != nil || !bytes.Equal(again, want) {
				t.Fatalf("size %d declared %d: body read again: %d bytes, %v", size, declared, len(again), err)
			}
		}
	}
	// A declared length over max is refused before (Engine.readBody); an
	// undeclared one, or one longer than declared, by the limit.
	for _, declared := range []int64{-1, 10} {
		req := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(strings.NewReader(strings.Repeat("x", 100))))
		req.ContentLength = declared
		if _, err := ReadHTTPBody(httptest.NewRecorder(), req, 99); err == nil {
			t.Fatalf("declared %d: a body over max was read", declared)
		}
	}
}
