package httpcore

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestInformationalStatusRecordRejected: nothing the middleware
// stores has a 1xx status (the capture passes informational responses
// through, a 101 releases the key, a hijack without a final status is
// stored as 200, CommitResponse refuses < 200), so a record with one is
// corrupt and refused. Accepted, its replay went out as the informational
// response followed by an implicit 200 with the stored body: a wrong
// status, marked replayed (found by review).
func TestInformationalStatusRecordRejected(t *testing.T) {
	rec := []byte{responseVersion, 0, 103, 0, 4, 'b', 'o', 'd', 'y'}
	v, err := parseResponse(rec)
	if err == nil {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeStored(w, "k", v)
		}))
		defer srv.Close()
		resp, gerr := http.Get(srv.URL)
		if gerr != nil {
			t.Fatal(gerr)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("record with status 103 accepted; its replay answered %d %q (%s: %q), want errCorruptResponse",
			resp.StatusCode, b, ReplayedHeader, resp.Header.Get(ReplayedHeader))
	}
	if !errors.Is(err, errCorruptResponse) {
		t.Fatalf("error %v does not wrap errCorruptResponse", err)
	}
}
