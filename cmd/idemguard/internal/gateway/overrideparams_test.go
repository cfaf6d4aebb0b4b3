package gateway

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// overrideUpstream runs a POST as the method its _method parameter names,
// as Rails (Rack::MethodOverride: the form body, urlencoded, multipart or
// without a Content-Type) and Laravel (PHP, which reads %5Fmethod, .method
// and +_method in a query as _method) do; it counts the PATCHes it runs
// and the bytes of the last body it got.
func overrideUpstream(t *testing.T) (u *httptest.Server, patches *atomic.Int64, lastBody *atomic.Value) {
	patches, lastBody = &atomic.Int64{}, &atomic.Value{}
	u = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		lastBody.Store(string(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		m := r.Method
		for k, v := range r.Header {
			// CGI-style (Puma, PHP): '-' and '_' are one.
			if strings.ToUpper(strings.ReplaceAll(k, "-", "_")) == "X_HTTP_METHOD_OVERRIDE" {
				m = strings.ToUpper(v[0])
			}
		}
		if r.Method == http.MethodPost {
			if r.Header.Get("Content-Type") == "" {
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			_ = r.ParseMultipartForm(1 << 20)
			if o := r.PostFormValue("_method"); o != "" {
				m = strings.ToUpper(o)
			}
			for k, v := range r.URL.Query() {
				if strings.NewReplacer(".", "_", " ", "_").Replace(k) == "_method" {
					m = strings.ToUpper(v[0])
				}
			}
		}
		if m == http.MethodPatch {
			patches.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.Close)
	return u, patches, lastBody
}

// TestMethodOverrideParametersRefused: a POST naming PATCH in a _method
// form field (Rails' default middleware reads it, Laravel's forms send
// it), in a query parameter PHP reads as _method (%5Fmethod, .method),
// or in an override field spelt with '_' (X_HTTP_METHOD_OVERRIDE, which
// Puma and PHP read as X-HTTP-Method-Override) went through the pass-through, unguarded, and ran the PATCH that
// "PATCH /orders/{id}" guards again under a key already used: only the
// query's literal "_method" was looked at. Such requests are refused
// (501); a form without the field passes through with its body intact,
// a form body the gateway cannot read whole is refused (413), and forms
// where no route guards another method are not read.
func TestMethodOverrideParametersRefused(t *testing.T) {
	u, patches, lastBody := overrideUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "PATCH /orders/{id}", 1), u.URL)
	do := func(method, path, ct, body string, header ...string) int {
		t.Helper()
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header[header[i]] = []string{header[i+1]}
		}
		req.Header.Set("Idempotency-Key", "k-param")
		req.Header.Set("X-Account-Id", "acme")
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode
	}
	const form = "application/x-www-form-urlencoded"
	if s := do("PATCH", "/orders/1", form, "qty=2"); s != http.StatusOK {
		t.Fatalf("PATCH: %d", s)
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	_ = mw.WriteField("qty", "2")
	_ = mw.WriteField("_method", "patch")
	_ = mw.Close()
	for _, c := range []struct{ path, ct, body string }{
		{"/orders/1", form, "qty=2&_method=patch"},
		{"/orders/1", form + "; charset=utf-8", "_method=PATCH"},
		{"/orders/1", "", "qty=2&_method=patch"},
		{"/orders/1", mw.FormDataContentType(), mp.String()},
		{"/orders/1?%5Fmethod=PATCH", "", ""},
		{"/orders/1?.method=PATCH", "", ""},
	} {
		if s := do("POST", c.path, c.ct, c.body); s != http.StatusNotImplemented {
			t.Errorf("POST %s (%q) %q with the key of PATCH /orders/1: %d; want it refused (501)", c.path, c.ct, c.body, s)
		}
	}
	for _, f := range []string{"X_HTTP_METHOD_OVERRIDE", "X_Http_Method_Override"} {
		if s := do("POST", "/orders/1", "", "", f, "PATCH"); s != http.StatusNotImplemented {
			t.Errorf("POST /orders/1 with %s: PATCH and the key of PATCH /orders/1: %d; want it refused (501)", f, s)
		}
	}
	if got := patches.Load(); got != 1 {
		t.Errorf("the upstream ran the PATCH %d times, want 1", got)
	}
	if s := do("POST", "/orders/1", form, "qty=3&note=method"); s != http.StatusOK || lastBody.Load() != "qty=3&note=method" {
		t.Errorf("POST /orders/1 with a form naming no method: %d, the upstream got %q; want it passed through whole", s, lastBody.Load())
	}
	big := "qty=1&pad=" + strings.Repeat("x", 1<<20)
	if s := do("POST", "/orders/1", form, big); s != http.StatusRequestEntityTooLarge {
		t.Errorf("POST /orders/1 with a form over max_body: %d, want 413", s)
	}
	if s := do("POST", "/users/1", form, big+"&_method=patch"); s != http.StatusOK || lastBody.Load() != big+"&_method=patch" {
		t.Errorf("POST /users/1 (no route guards PATCH there): %d; want it passed through whole", s)
	}
}
