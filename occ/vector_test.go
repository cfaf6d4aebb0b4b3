package occ_test

import (
	"database/sql"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/idemguard/idemguard/occ"
)

// A few writers, so random vectors share writers and often tie; counters
// small for the same reason, with the largest one mixed in.
var (
	fewWriters = rapid.SampledFrom([]string{"a", "b", "c", "eu-west", "us-east-1"})
	anyWriter  = rapid.OneOf(fewWriters, rapid.String().Filter(func(s string) bool { return occ.ValidWriter(s) == nil }),
		rapid.SampledFrom([]string{"x:y", "x,y", "%", "%41", "ü", `"`, " ", "\t", "\u2028"}))
	counter = rapid.OneOf(rapid.Uint64Range(0, 3), rapid.Just(uint64(math.MaxUint64)), rapid.Uint64())
)

func vectorOf(w *rapid.Generator[string], c *rapid.Generator[uint64]) *rapid.Generator[occ.Vector] {
	return rapid.Custom(func(t *rapid.T) occ.Vector {
		v, err := occ.FromMap(rapid.MapOfN(w, c, 0, 6).Draw(t, "counters"))
		if err != nil {
			t.Fatalf("FromMap: %v", err)
		}
		return v
	})
}

var (
	smallVector = vectorOf(fewWriters, rapid.Uint64Range(0, 3))
	anyVector   = vectorOf(anyWriter, counter)
)

// leq is the definition the order must match: every counter of a is at
// most b's (a writer absent counts 0).
func leq(a, b occ.Vector) bool {
	for w, n := range a.All() {
		if n > b.Get(w) {
			return false
		}
	}
	return true
}

func before(a, b occ.Vector) bool { o := a.Compare(b); return o == occ.Before || o == occ.Equal }

func TestCompareMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := smallVector.Draw(t, "a"), smallVector.Draw(t, "b")
		want := occ.Concurrent
		switch ab, ba := leq(a, b), leq(b, a); {
		case ab && ba:
			want = occ.Equal
		case ab:
			want = occ.Before
		case ba:
			want = occ.After
		}
		if got := a.Compare(b); got != want {
			t.Fatalf("[%s].Compare([%s]) = %s, want %s", a, b, got, want)
		}
	})
}

func TestComparePartialOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := smallVector.Draw(t, "a"), smallVector.Draw(t, "b")
		// reflexive
		if o := a.Compare(a); o != occ.Equal {
			t.Fatalf("[%s] compared with itself: %s", a, o)
		}
		// antisymmetric: a ≤ b and b ≤ a only when equal; the answers mirror
		ab, ba := a.Compare(b), b.Compare(a)
		mirror := map[occ.Ordering]occ.Ordering{occ.Equal: occ.Equal, occ.Before: occ.After, occ.After: occ.Before, occ.Concurrent: occ.Concurrent}
		if ba != mirror[ab] {
			t.Fatalf("[%s] vs [%s]: %s one way, %s the other", a, b, ab, ba)
		}
		if before(a, b) && before(b, a) && (ab != occ.Equal || a.String() != b.String()) {
			t.Fatalf("[%s] and [%s] are below each other but %s", a, b, ab)
		}
		if (ab == occ.Equal) != (a.String() == b.String()) {
			t.Fatalf("[%s] vs [%s]: %s", a, b, ab)
		}
		// transitive: on random triples, and on chains built to hold
		c := smallVector.Draw(t, "c")
		if before(a, b) && before(b, c) && !before(a, c) {
			t.Fatalf("[%s] ≤ [%s] ≤ [%s] but not [%s] ≤ [%s]", a, b, c, a, c)
		}
		up1 := a.Merge(smallVector.Draw(t, "x")).Increment(fewWriters.Draw(t, "w1"))
		up2 := up1.Merge(smallVector.Draw(t, "y"))
		if a.Compare(up1) != occ.Before || !before(up1, up2) || a.Compare(up2) != occ.Before {
			t.Fatalf("chain [%s] < [%s] ≤ [%s]: %s, %s, %s", a, up1, up2, a.Compare(up1), up1.Compare(up2), a.Compare(up2))
		}
	})
}

func TestMergeIsLeastUpperBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := smallVector.Draw(t, "a"), smallVector.Draw(t, "b"), smallVector.Draw(t, "c")
		eq := func(what string, x, y occ.Vector) {
			if x.Compare(y) != occ.Equal {
				t.Fatalf("%s: [%s] ≠ [%s]", what, x, y)
			}
		}
		m := a.Merge(b)
		eq("commutative", m, b.Merge(a))
		eq("associative", a.Merge(b).Merge(c), a.Merge(b.Merge(c)))
		eq("idempotent", a.Merge(a), a)
		eq("merge with self result", m.Merge(a), m)
		if !before(a, m) || !before(b, m) {
			t.Fatalf("[%s] ⊔ [%s] = [%s] is not above both", a, b, m)
		}
		// least: pointwise maximum, so below any other upper bound
		for w := range a.Merge(b).All() {
			if m.Get(w) != max(a.Get(w), b.Get(w)) {
				t.Fatalf("[%s] ⊔ [%s] = [%s]: %s is not the max", a, b, m, w)
			}
		}
		ub := a.Merge(b).Merge(c)
		if !before(m, ub) {
			t.Fatalf("[%s] is an upper bound of [%s], [%s] but below [%s]", ub, a, b, m)
		}
		// arguments unchanged (immutability)
		a2 := a.String()
		_ = a.Merge(c)
		_ = a.Increment("a")
		if a.String() != a2 {
			t.Fatalf("Merge or Increment changed its receiver: %s → %s", a2, a)
		}
	})
}

func TestIncrement(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := smallVector.Draw(t, "v")
		w := anyWriter.Draw(t, "w")
		n := v.Increment(w)
		if v.Compare(n) != occ.Before || n.Get(w) != v.Get(w)+1 {
			t.Fatalf("[%s].Increment(%q) = [%s]", v, w, n)
		}
		for x, c := range v.All() {
			if x != w && n.Get(x) != c {
				t.Fatalf("[%s].Increment(%q) = [%s] changed %q", v, w, n, x)
			}
		}
		// two writers incrementing the same vector are concurrent
		u := fewWriters.Draw(t, "u")
		if u != w && v.Increment(u).Compare(n) != occ.Concurrent {
			t.Fatalf("[%s] incremented by %q and by %q: not concurrent", v, u, w)
		}
	})
}

func TestEncodingRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := anyVector.Draw(t, "v")
		text := v.String()
		p, err := occ.Parse(text)
		if err != nil || p.Compare(v) != occ.Equal || p.String() != text {
			t.Fatalf("Parse(%q) = [%s], %v", text, p, err)
		}
		var u occ.Vector
		if err := u.UnmarshalText([]byte(text)); err != nil || u.Compare(v) != occ.Equal {
			t.Fatalf("UnmarshalText(%q) = [%s], %v", text, u, err)
		}
		// JSON, inside a struct as an application would carry it
		type doc struct {
			V occ.Vector `json:"v"`
		}
		b, err := json.Marshal(doc{v})
		if err != nil {
			t.Fatal(err)
		}
		var d doc
		if err := json.Unmarshal(b, &d); err != nil || d.V.Compare(v) != occ.Equal {
			t.Fatalf("JSON %s → [%s], %v", b, d.V, err)
		}
		var m map[string]uint64
		if err := json.Unmarshal(b, &struct{ V *map[string]uint64 }{&m}); err != nil || len(m) != v.Len() {
			t.Fatalf("JSON %s is not an object of counters: %v %v", b, m, err)
		}
		// the database form
		val, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		var s occ.Vector
		if err := s.Scan(val); err != nil || s.Compare(v) != occ.Equal {
			t.Fatalf("Scan(Value()) of [%s] = [%s], %v", v, s, err)
		}
		if err := s.Scan([]byte(val.(string))); err != nil || s.Compare(v) != occ.Equal {
			t.Fatalf("Scan([]byte) of [%s] = [%s], %v", v, s, err)
		}
	})
}

func TestTextForm(t *testing.T) {
	v, err := occ.FromMap(map[string]uint64{"us-east": 12, "eu-west": 3, "arn:aws:x,y": 1, "idle": 0, "é": 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.String(), "arn%3Aaws%3Ax%2Cy:1,eu-west:3,us-east:12,%C3%A9:2"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	b, _ := json.Marshal(v)
	if got, want := string(b), `{"arn:aws:x,y":1,"eu-west":3,"us-east":12,"é":2}`; got != want {
		t.Fatalf("JSON = %s, want %s", got, want)
	}
	for _, bad := range []string{
		",", "a", "a:", ":1", "a:0", "a:01", "a:-1", "a:+1", "a:1,", ",a:1", "a:1,,b:2",
		"b:1,a:1", "a:1,a:2", "a:18446744073709551616", "a:1.0", "a:1e3", "%61:1", "%3a:1",
		"%3:1", "%:1", "%ZZ:1", "a b:1", "a%00:1", "%FF:1", "x:y:1", "a:1 ",
	} {
		if v, err := occ.Parse(bad); err == nil {
			t.Errorf("Parse(%q) = [%s], want an error", bad, v)
		} else if !strings.HasPrefix(err.Error(), "occ: version vector text") {
			t.Errorf("Parse(%q) error %q does not say what it read", bad, err)
		}
	}
	if v, err := occ.Parse("a:18446744073709551615"); err != nil || v.Get("a") != math.MaxUint64 {
		t.Errorf("largest counter: [%s], %v", v, err)
	}
}

func TestJSONForm(t *testing.T) {
	good := map[string]string{
		`{}`:                         "",
		`null`:                       "",
		` { "b" : 2 , "a":1 } `:      "a:1,b:2",
		`{"a": 0, "b": 1}`:           "b:1",
		`{"a":18446744073709551615}`: "a:18446744073709551615",
		`{"\u00e9":1}`:               "%C3%A9:1",
		// A fraction of zeros, as jsonb keeps a number written so.
		`{"a":1.0,"b":2.000,"c":0.0}`:  "a:1,b:2",
		`{"a":18446744073709551615.0}`: "a:18446744073709551615",
	}
	good[`{"\ud83d\ude00":2,"\\ud800":1}`] = "%5Cud800:1,%F0%9F%98%80:2" // a pair; an escaped backslash before "ud800"
	for in, want := range good {
		var v occ.Vector
		if err := json.Unmarshal([]byte(in), &v); err != nil || v.String() != want {
			t.Errorf("Unmarshal(%s) = [%s], %v; want [%s]", in, v, err, want)
		}
	}
	keep, _ := occ.Parse("keep:1")
	for _, bad := range []string{
		`[]`, `1`, `"a:1"`, `{"a":-1}`, `{"a":1.5}`, `{"a":1.01}`, `{"a":1e2}`, `{"a":1.0e0}`, `{"a":-1.0}`,
		`{"a":18446744073709551616.0}`, `{"a":"1"}`,
		`{"a":null}`, `{"a":{}}`, `{"a":[1]}`, `{"":1}`, `{"\u0000":1}`, `{"a":1,"a":2}`,
		`{"a":18446744073709551616}`, `{"a":true}`, `{"a":1} x`, `{"a":1`, ``,
		// Writer ids encoding/json would read as U+FFFD: bytes that are
		// not UTF-8, and surrogate escapes outside a pair.
		"{\"\xff\":1}", "{\"a\xfeb\":7}", `{"\ud800":1}`, `{"\udc00":1}`, `{"a\ud800b":1}`, `{"\ud800\u0041":1}`,
	} {
		v := keep
		if err := v.UnmarshalJSON([]byte(bad)); err == nil {
			t.Errorf("UnmarshalJSON(%s) = [%s], want an error", bad, v)
		}
		if v.String() != "keep:1" {
			t.Errorf("UnmarshalJSON(%s) changed the vector on error: [%s]", bad, v)
		}
	}
	var v occ.Vector
	if err := v.Scan(nil); err == nil {
		t.Error("Scan(NULL) succeeded")
	}
	if err := v.Scan(42); err == nil {
		t.Error("Scan(int) succeeded")
	}
	var n sql.Null[occ.Vector]
	if err := n.Scan(nil); err != nil || n.Valid {
		t.Errorf("sql.Null[Vector].Scan(nil) = %v, valid %v", err, n.Valid)
	}
	if err := n.Scan([]byte(`{"a":2}`)); err != nil || !n.Valid || n.V.Get("a") != 2 {
		t.Errorf("sql.Null[Vector].Scan = %v, %+v", err, n)
	}
}

func TestWriterIDs(t *testing.T) {
	for _, bad := range []string{"", "a\x00b", "\xff"} {
		if occ.ValidWriter(bad) == nil {
			t.Errorf("ValidWriter(%q) = nil", bad)
		}
		if _, err := occ.FromMap(map[string]uint64{bad: 1}); err == nil {
			t.Errorf("FromMap with writer %q succeeded", bad)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Increment(%q) did not panic", bad)
				}
			}()
			occ.Vector{}.Increment(bad)
		}()
	}
	top, _ := occ.FromMap(map[string]uint64{"a": math.MaxUint64})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Increment past 2^64-1 did not panic")
			}
		}()
		top.Increment("a")
	}()
	// The zero value is the empty vector, before every other.
	var zero occ.Vector
	if !zero.IsZero() || zero.Len() != 0 || zero.String() != "" || zero.Compare(top) != occ.Before {
		t.Errorf("zero vector: %q %d %s", zero, zero.Len(), zero.Compare(top))
	}
	if b, _ := json.Marshal(zero); string(b) != "{}" {
		t.Errorf("zero vector JSON = %s", b)
	}
	m := top.Map()
	m["a"] = 1
	if top.Get("a") != math.MaxUint64 {
		t.Error("changing Map's result changed the vector")
	}
	for _, o := range []occ.Ordering{occ.Equal, occ.Before, occ.After, occ.Concurrent, 9} {
		if o.String() == "" {
			t.Errorf("Ordering(%d) has no name", o)
		}
	}
}
