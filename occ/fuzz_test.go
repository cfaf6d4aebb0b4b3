package occ_test

import (
	"encoding/json"
	"testing"

	"github.com/idemguard/idemguard/occ"
)

// FuzzParse: whatever Parse accepts is canonical (String gives back the
// same text) and means the same vector when read again. The seeds run in
// every `go test`; `go test -fuzz FuzzParse ./occ` searches further.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "a:1", "a:1,b:2", "eu-west:3,us-east:12", "%C3%A9:2", "arn%3Aaws:1",
		"a:18446744073709551615", "a:18446744073709551616", "b:1,a:1", "a:0", "a:01",
		"%61:1", "%3a:1", "%:1", "a:1,", ",", "a%00:1", "%FF:1", "x:y:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := occ.Parse(s)
		if err != nil {
			if !v.IsZero() {
				t.Fatalf("Parse(%q) failed but returned [%s]", s, v)
			}
			return
		}
		if v.String() != s {
			t.Fatalf("Parse(%q) accepted a non-canonical text: it prints as %q", s, v.String())
		}
		for w, n := range v.All() {
			if occ.ValidWriter(w) != nil || n == 0 {
				t.Fatalf("Parse(%q) made an invalid entry %q:%d", s, w, n)
			}
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var u occ.Vector
		if err := json.Unmarshal(b, &u); err != nil || u.Compare(v) != occ.Equal {
			t.Fatalf("Parse(%q) → JSON %s → [%s], %v", s, b, u, err)
		}
	})
}

// FuzzUnmarshalJSON: whatever UnmarshalJSON (and so Scan) accepts survives
// a round trip through both encodings; what it refuses leaves the vector
// as it was.
func FuzzUnmarshalJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `null`, `{"a":1}`, `{"b":2,"a":1}`, ` {"a" : 0} `, `{"a":18446744073709551615}`,
		`{"a":18446744073709551616}`, `{"a":1,"a":2}`, `{"a":1.0}`, `{"a":-1}`, `{"":1}`,
		`{"\u0000":1}`, `{"\ud800":1}`, `[]`, `{"a":1} x`, `{"a":{"b":1}}`, `{"é":1}`,
	} {
		f.Add([]byte(s))
	}
	keep, _ := occ.Parse("keep:7")
	f.Fuzz(func(t *testing.T, data []byte) {
		v := keep
		if err := v.UnmarshalJSON(data); err != nil {
			if v.String() != "keep:7" {
				t.Fatalf("UnmarshalJSON(%q) failed (%v) but changed the vector to [%s]", data, err, v)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("UnmarshalJSON accepted invalid JSON %q", data)
		}
		b, err := v.MarshalJSON()
		if err != nil || !json.Valid(b) {
			t.Fatalf("MarshalJSON of [%s] = %q, %v", v, b, err)
		}
		var u occ.Vector
		if err := u.Scan(b); err != nil || u.Compare(v) != occ.Equal {
			t.Fatalf("%q → %s → [%s], %v", data, b, u, err)
		}
		p, err := occ.Parse(v.String())
		if err != nil || p.Compare(v) != occ.Equal {
			t.Fatalf("%q → text %q → [%s], %v", data, v.String(), p, err)
		}
	})
}
