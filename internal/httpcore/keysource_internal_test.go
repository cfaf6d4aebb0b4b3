package httpcore

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// rfc6901 is the example document of RFC 6901 section 5.
const rfc6901 = `{
  "foo": ["bar", "baz"],
  "": 0,
  "a/b": 1,
  "c%d": 2,
  "e^f": 3,
  "g|h": 4,
  "i\\j": 5,
  "k\"l": 6,
  " ": 7,
  "m~n": 8
}`

func TestBodyKeyRFC6901(t *testing.T) {
	cases := map[string]string{ // pointer → key (a string or number found there)
		"/foo/0": "bar",
		"/foo/1": "baz",
		"/":      "0",
		"/a~1b":  "1",
		"/c%d":   "2",
		"/e^f":   "3",
		"/g|h":   "4",
		"/i\\j":  "5",
		"/k\"l":  "6",
		"/ ":     "7",
		"/m~0n":  "8",
	}
	for ptr, want := range cases {
		got, err := KeyFromBody(ptr).bodyKey([]byte(rfc6901))
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", ptr, got, err, want)
		}
	}
	// The whole document and /foo are not strings or numbers.
	for _, ptr := range []string{"", "/foo"} {
		if _, err := KeyFromBody(ptr).bodyKey([]byte(rfc6901)); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("%q: %v, want ErrMalformedKey", ptr, err)
		}
	}
	// Pointers that select nothing.
	for _, ptr := range []string{"/nope", "/foo/2", "/foo/-", "/foo/01", "/foo/+1", "/foo/x", "/foo/0/x", "/a/b"} {
		if _, err := KeyFromBody(ptr).bodyKey([]byte(rfc6901)); !errors.Is(err, errNoBodyKey) {
			t.Errorf("%q: %v, want no key", ptr, err)
		}
	}
	// "~01" is "~1" (the ~1 is replaced first), not "/".
	if got, err := KeyFromBody("/~01").bodyKey([]byte(`{"~1":"tilde-one","/":"slash"}`)); err != nil || got != "tilde-one" {
		t.Errorf("~01: %q %v", got, err)
	}
	if got, err := KeyFromBody("").bodyKey([]byte(` "whole" `)); err != nil || got != "whole" {
		t.Errorf("whole document: %q %v", got, err)
	}
	if got, err := KeyFromBody("/k").bodyKey([]byte(`{"k":"\u00e9t\u00e9"}`)); err != nil || got != "été" {
		t.Errorf("escaped UTF-8: %q %v", got, err)
	}
	if _, err := KeyFromBody("/k").bodyKey([]byte(`{"k":"x"`)); !errors.Is(err, errNotJSON) {
		t.Errorf("truncated JSON: %v", err)
	}
}

// TestComputedKeyDigest: the computed key covers each input on its own;
// field boundaries cannot be shifted to make two requests one.
func TestComputedKeyDigest(t *testing.T) {
	ks := ComputedKey("X-A")
	key := func(method, target, ct string, body string, xa ...string) string {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		for _, v := range xa {
			r.Header.Add("X-A", v)
		}
		return ks.computedKey(NetRequest{r}, DefaultScope(NetRequest{r}), []byte(body))
	}
	base := key("POST", "/o?q=1", "application/json", `{"a":1}`, "v")
	if !strings.HasPrefix(base, computedPrefix) || len(base) != len(computedPrefix)+64 {
		t.Fatalf("key %q", base)
	}
	if again := key("POST", "/o?q=1", "application/json", `{"a":1}`, "v"); again != base {
		t.Fatalf("same request, other key: %q %q", again, base)
	}
	others := map[string]string{
		"method":       key("PATCH", "/o?q=1", "application/json", `{"a":1}`, "v"),
		"path":         key("POST", "/p?q=1", "application/json", `{"a":1}`, "v"),
		"query":        key("POST", "/o?q=2", "application/json", `{"a":1}`, "v"),
		"content type": key("POST", "/o?q=1", "text/plain", `{"a":1}`, "v"),
		"body":         key("POST", "/o?q=1", "application/json", `{"a":2}`, "v"),
		"header":       key("POST", "/o?q=1", "application/json", `{"a":1}`, "w"),
		"no header":    key("POST", "/o?q=1", "application/json", `{"a":1}`),
		"two values":   key("POST", "/o?q=1", "application/json", `{"a":1}`, "v", "v"),
		"shifted":      key("POST", "/o?q=1", "application/json", `{"a":1}`, "v", ""),
	}
	seen := map[string]string{base: "base"}
	for name, k := range others {
		if prev, dup := seen[k]; dup {
			t.Errorf("%s gives the same key as %s", name, prev)
		}
		seen[k] = name
	}
}

// The fingerprint and the computed key are kept in Redis and in the SQL
// backstop for as long as a key is remembered: the same request must give
// the same digest from one version to the next, or a retry across an
// upgrade gets 422 (or runs again). These are the values of the first
// release that computed them.
func TestDigestsStable(t *testing.T) {
	body := []byte(`{"sku":"tea"}`)
	r := httptest.NewRequest("POST", "/orders/a%2Fb?x=1&y=2", strings.NewReader(string(body)))
	r.Header.Set("Content-Type", "application/json")
	if got, want := DefaultFingerprint(NetRequest{r}, body), "618e1cc31d004e249c2b5afec071869c03808206c112cbc929f10d11ca05d14c"; got != want {
		t.Errorf("DefaultFingerprint %s, want %s", got, want)
	}
	r.Header.Add("X-Client", "c1")
	r.Header.Add("X-Client", "c2")
	if got, want := ComputedKey("X-Client", "X-None").computedKey(NetRequest{r}, "POST /orders/{id}", body),
		"computed:a3c09148cfc14d97365ac5f9e9d01c9edba41cfc350187813f81579d4919a78b"; got != want {
		t.Errorf("computed key %s, want %s", got, want)
	}
	// A path, query or header field longer than the hasher's scratch
	// buffer keeps, hashed twice: the same digest.
	long := httptest.NewRequest("POST", "/"+strings.Repeat("p", 3*maxPooledScratch)+"?q="+strings.Repeat("q", maxPooledScratch), nil)
	long.Header.Set("X-Client", strings.Repeat("c", maxPooledScratch))
	ks := ComputedKey("X-Client")
	fp, ck := DefaultFingerprint(NetRequest{long}, body), ks.computedKey(NetRequest{long}, "r", body)
	if DefaultFingerprint(NetRequest{long}, body) != fp || ks.computedKey(NetRequest{long}, "r", body) != ck || DefaultFingerprint(NetRequest{r}, body) == fp {
		t.Error("digests of a long request are not stable")
	}
}
