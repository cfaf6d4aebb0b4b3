package gateway

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
)

// TestUpstreamStatusesWithoutBody: answers that carry no body (204, 304)
// and interim answers (103 Early Hints before the 201) are stored and
// replayed as the upstream gave them: the final status, its fields, no
// body; a replay sends no interim answer (the upstream is not asked).
func TestUpstreamStatusesWithoutBody(t *testing.T) {
	cases := []struct {
		name   string
		status int
		handle func(w http.ResponseWriter)
	}{
		{"204", http.StatusNoContent, func(w http.ResponseWriter) {
			w.Header().Set("X-Done", "yes")
			w.WriteHeader(http.StatusNoContent)
		}},
		{"304", http.StatusNotModified, func(w http.ResponseWriter) {
			w.Header().Set("X-Done", "yes")
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(http.StatusNotModified)
		}},
		{"103 then 201", http.StatusCreated, func(w http.ResponseWriter) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("X-Done", "yes")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "created")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := newUpstream(t)
			u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
				c.handle(w)
				return true
			})
			e := startGateway(t, basicConfig, u.URL)
			var first []byte
			for i := range 2 {
				var interim atomic.Int32
				trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
					interim.Add(1)
					return nil
				}}
				req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"s1"}`))
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
				req.Header.Set("Idempotency-Key", "k-status")
				req.Header.Set("X-Account-Id", "acme")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("response %d: %d %v %q, %d interim", i, resp.StatusCode, resp.Header, b, interim.Load())
				if resp.StatusCode != c.status || resp.Header.Get("X-Done") != "yes" || (resp.Header.Get("Idempotent-Replayed") == "true") != (i == 1) {
					t.Errorf("response %d: %d %v; want %d with X-Done", i, resp.StatusCode, resp.Header, c.status)
				}
				if i == 0 {
					first = b
				} else if string(b) != string(first) {
					t.Errorf("replay body %q, first %q", b, first)
				}
			}
			if n := u.count("s1"); n != 1 {
				t.Fatalf("upstream ran %d times", n)
			}
		})
	}
}
