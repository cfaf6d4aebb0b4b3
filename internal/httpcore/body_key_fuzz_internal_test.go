package httpcore

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemguard/idemguard/guard"
)

// FuzzBodyKey: for any body, bodyKey never panics, answers
// errNoBodyKey or an error wrapping ErrMalformedKey, and a key it accepts
// is one the store takes, and is the text the body spells: it holds
// U+FFFD only where the body does (as the character or as its escape), so
// two bodies whose keys differ never become one key by encoding/json's
// replacement of bad bytes and lone surrogates; and the key, written back
// as a JSON string, reads as itself.
func FuzzBodyKey(f *testing.F) {
	for _, s := range []string{
		`{"id":"a"}`, `{"id":12}`, `{"id":-1.5e3}`, `{"id":null}`, `{"id":""}`, `{"id":"\u0000"}`,
		"{\"id\":\"caf\xe9\"}", `{"id":"\ud800"}`, `{"id":"\ud83d\ude00"}`, `{"id":"\ud83d\u0041"}`,
		`{"id":"\\ud800"}`, `{"id":"\ufffd"}`, "{\"id\":\"\uFFFD\"}", `{"ID":"x","id":"y"}`, `[1]`, `not json`,
		`{"id":"` + strings.Repeat("x", 256) + `"}`, `{"id":"\udc00\ud800"}`,
		`{"id":"a","id":null}`, `{"id":"a"} x`, `{"id":"a"}{"id":"b"}`, `{"x":1} {"id":"a"}`,
	} {
		f.Add([]byte(s))
	}
	ks := KeyFromBody("/id")
	f.Fuzz(func(t *testing.T, body []byte) {
		key, err := ks.bodyKey(body)
		if err != nil {
			if !errors.Is(err, errNoBodyKey) && !errors.Is(err, ErrMalformedKey) {
				t.Fatalf("error %v is neither errNoBodyKey nor ErrMalformedKey", err)
			}
			return
		}
		if err := (guard.Key{Scope: "-", ID: key}).Validate(); err != nil {
			t.Fatalf("accepted %q, which the store refuses: %v", key, err)
		}
		if !utf8.ValidString(key) {
			t.Fatalf("accepted %q: not UTF-8", key)
		}
		if strings.ContainsRune(key, utf8.RuneError) && !bytes.Contains(body, []byte("\uFFFD")) &&
			!bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
			t.Fatalf("key %q holds U+FFFD that %q does not spell", key, body)
		}
		lit, _ := json.Marshal(key)
		if back, err := ks.bodyKey([]byte(`{"id":` + string(lit) + `}`)); err != nil || back != key {
			t.Fatalf("key %q written as %s reads as %q, %v", key, lit, back, err)
		}
	})
}
