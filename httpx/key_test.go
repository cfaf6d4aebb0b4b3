package httpx_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

func TestParseKey(t *testing.T) {
	good := map[string]string{
		"abc":                                "abc",
		"  0190b7c2-7a1e-7c3d  ":             "0190b7c2-7a1e-7c3d",
		"\tk:1/2;x=y\t":                      "k:1/2;x=y",
		`"abc"`:                              "abc",
		`"a b"`:                              "a b",
		`"a\"b\\c"`:                          `a"b\c`,
		`"a,b"`:                              "a,b",
		strings.Repeat("k", 255):             strings.Repeat("k", 255),
		`"` + strings.Repeat("k", 255) + `"`: strings.Repeat("k", 255),
	}
	for in, want := range good {
		got, err := httpx.ParseKey(in)
		if err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{
		"", "  ", `""`, strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`,
		"a b", "a,b", "a\x00", "a\x1f", "a\x7f", "\x80", "ключ", `a"b`, `a\b`,
		`"abc`, `"abc\"`, `"a\nb"`, `"a\qb"`, `"a"b`, `"a";p=1`, "\"a\x01\"", "\"a\x7f\"", "\"é\"",
	}
	for _, in := range bad {
		if got, err := httpx.ParseKey(in); !errors.Is(err, httpx.ErrMalformedKey) {
			t.Errorf("ParseKey(%q) = %q, %v; want ErrMalformedKey", in, got, err)
		}
	}
}

// FuzzParseKey: ParseKey never panics; a key it accepts is 1..255 bytes of
// printable ASCII that the store accepts, and quoting it as an RFC 8941
// string reads back the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"a\"b"`, `"\\"`, "  x  ", `"`, `\`, "a,b", strings.Repeat("z", 256), "\x00", "\"\x7f\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := httpx.ParseKey(in)
		if err != nil {
			if !errors.Is(err, httpx.ErrMalformedKey) {
				t.Fatalf("error %v does not wrap ErrMalformedKey", err)
			}
			return
		}
		if len(k) == 0 || len(k) > httpx.MaxKeyLen {
			t.Fatalf("accepted %d-byte key", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted byte %#x", k[i])
			}
		}
		if err := (guard.Key{Scope: "s", ID: k}).Validate(); err != nil {
			t.Fatalf("accepted key the store refuses: %v", err)
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if back, err := httpx.ParseKey(quoted); err != nil || back != k {
			t.Fatalf("round trip of %q via %q: %q, %v", k, quoted, back, err)
		}
	})
}
