package gateway

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
)

// rackUpstream runs a POST as the method its _method form field names, as
// Rack::MethodOverride (Rails' default middleware) does. The body is a form
// when the request has no Content-Type or when its media type as
// Rack::MediaType.type reads it (the text before the first ';' or ',',
// right-stripped, lower case) is application/x-www-form-urlencoded; a
// multipart body's boundary is found as Rack's multipart parser finds it,
// anywhere in the field. PHP's SAPI reads the type alike before it fills
// $_POST, where Laravel reads _method. It counts the PATCHes it runs.
func rackUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	boundary := regexp.MustCompile(`(?i)\Amultipart/.*boundary="?([^";,]+)"?`)
	patches := &atomic.Int64{}
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m := r.Method
		if r.Method == http.MethodPost {
			ct := r.Header.Get("Content-Type")
			mt := ct
			if i := strings.IndexAny(mt, ";,"); i >= 0 {
				mt = mt[:i]
			}
			mt = strings.ToLower(strings.TrimRight(mt, " \t"))
			switch b := boundary.FindStringSubmatch(ct); {
			case ct == "" || mt == "application/x-www-form-urlencoded":
				if q, err := url.ParseQuery(string(body)); err == nil && q.Get("_method") != "" {
					m = strings.ToUpper(q.Get("_method"))
				}
			case b != nil:
				// As lib/rack/multipart.rb names a part: the last name
				// parameter of its Content-Disposition, whatever its
				// type; else its Content-ID.
				for _, part := range strings.Split(string(body), "--"+b[1]) {
					head, v, ok := strings.Cut(part, "\r\n\r\n")
					if !ok {
						continue
					}
					if rackPartName(head+"\r\n") == "_method" {
						m = strings.ToUpper(strings.TrimSuffix(v, "\r\n"))
					}
				}
			}
		}
		if m == http.MethodPatch {
			patches.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.Close)
	return u, patches
}

// How Rack 2.2 names a multipart part (lib/rack/multipart.rb; 3.0 the
// same, 3.1's disposition pattern as unanchored):
//
//	VALUE = /"(?:\\"|[^"])*"|#{TOKEN}/
//	MULTIPART_CONTENT_DISPOSITION = /Content-Disposition:.*;\s*name=(#{VALUE})/ni
//	MULTIPART_CONTENT_ID = /Content-ID:\s*([^#{EOL}]*)/ni
//
// and parser.rb: name = dequote(head[MULTIPART_CONTENT_DISPOSITION, 1]),
// else head[MULTIPART_CONTENT_ID, 1]; dequote strips the quotes and every
// backslash escape. Neither pattern is anchored at a field's start.
var (
	rackDisposition = regexp.MustCompile(`(?i)Content-Disposition:.*;\s*name=("(?:\\"|[^"])*"|[^\s()<>,;:\\"/\[\]?=]+)`)
	rackContentID   = regexp.MustCompile(`(?i)Content-ID:\s*([^\r\n]*)`)
	rackEscape      = regexp.MustCompile(`\\(.)`)
)

func rackPartName(head string) string {
	if m := rackDisposition.FindStringSubmatch(head); m != nil {
		n := m[1]
		if len(n) >= 2 && n[0] == '"' && n[len(n)-1] == '"' {
			n = n[1 : len(n)-1]
		}
		return rackEscape.ReplaceAllString(n, "$1")
	}
	if m := rackContentID.FindStringSubmatch(head); m != nil {
		return m[1]
	}
	return ""
}

// TestOverrideInFormWithLooseContentType: a POST whose form body names
// PATCH in _method, on a path where a route guards PATCH, was refused (501)
// only when Go's mime.ParseMediaType accepted its Content-Type. One whose
// parameters do not parse there ("application/x-www-form-urlencoded;
// charset", a second type after a comma, a parameter given twice, the
// same on multipart) was taken for no form and passed through unguarded,
// while Rack and PHP read the type before the first ';' or ',' and ran the
// PATCH: a second effect under a key already used.
func TestOverrideInFormWithLooseContentType(t *testing.T) {
	u, patches := rackUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "PATCH /orders/{id}", 1), u.URL)
	do := func(method, ct, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, e.srv.URL+"/orders/1", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "k-ct")
		req.Header.Set("X-Account-Id", "acme")
		req.Header.Set("Content-Type", ct)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode
	}
	const form = "application/x-www-form-urlencoded"
	if s := do("PATCH", form, "qty=2"); s != http.StatusOK || patches.Load() != 1 {
		t.Fatalf("PATCH: %d, %d PATCHes run", s, patches.Load())
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	_ = mw.WriteField("qty", "2")
	_ = mw.WriteField("_method", "patch")
	_ = mw.Close()
	cases := []struct{ ct, body string }{
		{form + "; charset", "qty=2&_method=PATCH"},
		{form + ", text/plain", "qty=2&_method=PATCH"},
		{form + "; charset=utf-8; charset=latin1", "qty=2&_method=PATCH"},
		{"Application/X-WWW-Form-Urlencoded;;", "qty=2&_method=PATCH"},
		{mw.FormDataContentType() + "; charset", mp.String()},
		{"multipart/form-data; boundary=" + mw.Boundary() + "; boundary=other", mp.String()},
	}
	// Parts Rack names _method and mime/multipart's FormName does not:
	// another disposition type, the name given twice, a Content-ID, a
	// backslash escape, a field whose name ends so.
	for _, h := range []string{`Content-Disposition: attachment; name="_method"`, "Content-ID: _method",
		`Content-Disposition: form-data; name="x"; name="_method"`, `Content-Disposition: attachment; name="\_method"`,
		`Content-Disposition: form-data; name="x"; name="_met\hod"`, `X-Content-Disposition: form-data; name="_method"`,
		`X-Content-ID: _method`} {
		cases = append(cases, struct{ ct, body string }{"multipart/form-data; boundary=XyZzY",
			"--XyZzY\r\nContent-Disposition: form-data; name=\"qty\"\r\n\r\n2\r\n--XyZzY\r\n" + h + "\r\n\r\nPATCH\r\n--XyZzY--\r\n"})
	}
	for _, c := range cases {
		before := patches.Load()
		if s := do("POST", c.ct, c.body); s != http.StatusNotImplemented || patches.Load() != before {
			t.Errorf("POST /orders/1 (Content-Type %q) naming PATCH in _method, with the key of PATCH /orders/1: %d, the upstream ran %d more PATCH; want it refused (501)",
				c.ct, s, patches.Load()-before)
		}
	}
	if got := patches.Load(); got != 1 {
		t.Errorf("the upstream ran the guarded PATCH %d times, want 1", got)
	}
	if s := do("POST", "text/plain; charset", "qty=2&_method=PATCH"); s != http.StatusOK {
		t.Errorf("POST /orders/1 with a body no framework reads as a form: %d, want it passed through", s)
	}
}
