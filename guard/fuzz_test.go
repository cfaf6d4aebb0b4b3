package guard

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

func FuzzKeyValidate(f *testing.F) {
	for _, s := range [][2]string{{"s", "id"}, {"", "x"}, {"s", ""}, {"s", "a\x00b"}, {"s", strings.Repeat("é", 200)}, {"{", "}"}, {"s", "\xff"}} {
		f.Add(s[0], s[1])
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never called: names need no server
	f.Cleanup(func() { client.Close() })
	st := NewRedisStore(client, RedisOptions{})
	f.Fuzz(func(t *testing.T, scope, id string) {
		k := Key{Scope: scope, ID: id}
		err := k.Validate()
		if err != nil {
			return
		}
		if id == "" || scope == "" || len(id) > MaxIDLen || len(scope) > MaxScopeLen || !utf8.ValidString(id) || !utf8.ValidString(scope) {
			t.Fatalf("Validate accepted %q", k)
		}
		for _, r := range scope + id {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("Validate accepted control character in %q", k)
			}
		}
		name := st.Name(k)
		if !strings.HasPrefix(name, DefaultPrefix+"{") || !strings.HasSuffix(name, "}") || len(name) != len(DefaultPrefix)+tagLen+2 ||
			strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 {
			t.Fatalf("name of %q: %q", k, name)
		}
		if again := st.Name(k); again != name {
			t.Fatalf("name not stable for %q", k)
		}
	})
}

// encodeStored writes s back in the record format: parseValue's inverse
// (it wrote version 1 and dropped the steps, so FuzzDecodeRecord failed on
// every valid record with steps).
func encodeStored(s stored) []byte {
	st := s.state
	if s.recovered {
		st -= 'a' - 'A'
	}
	version := byte(recordVersion)
	if s.steps != "" {
		version = recordVersionSteps // a record with steps keeps them last
	}
	b := []byte{version, st}
	b = appendUvarint(appendUvarint(b, s.fence), s.attempt)
	b = append(append(append(b, s.fp...), s.tok...), s.ptok...)
	b = append(appendUvarint(b, int64(len(s.lastErr))), s.lastErr...)
	switch s.state {
	case stPending:
		b = appendUvarint(b, s.retention)
		fallthrough
	case stFailed:
		b = appendKey(b, Key{Scope: s.scope, ID: s.id})
	case stCompleted:
		b = append(appendUvarint(b, int64(len(s.result))), s.result...)
	}
	return append(b, s.steps...)
}

// recordSeeds are values of every shape: valid records of each state, and
// corrupt ones.
func recordSeeds() [][]byte {
	p, _, _ := newPending(ClaimRequest{Key: Key{Scope: "tenant-42/POST /orders", ID: "0b9e3c1e-5a7d-4b8e-9f51-2c1d5f6a7b80"},
		Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: strings.Repeat("f", 64), Lease: 30e9, TTL: 86400e9}, 0)
	tok := string(appendToken(nil, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
	fp := string(appendFingerprint(nil, "fp"))
	completed := encodeStored(stored{state: stCompleted, fence: 3, attempt: 2, fp: fp, tok: tok, ptok: "\x01A", lastErr: "boom", result: strings.Repeat("r", 200)})
	failed := encodeStored(stored{state: stFailed, recovered: true, fence: 2, attempt: 2, fp: fp, tok: "\x01B", ptok: "\x00", lastErr: "lease expired", scope: "s", id: "i"})
	released := encodeStored(stored{state: stReleased, fence: 1, attempt: 1, fp: fp, tok: "\x01C", ptok: "\x00"})
	big := encodeStored(stored{state: stCompleted, fence: RedisMaxFence, attempt: RedisMaxFence, fp: fp, tok: tok, ptok: "\x00"})
	return [][]byte{
		p.buf, completed, failed, released, big,
		nil, {}, {1}, {2, 'c'}, {1, 'x'}, {1, 'R'},
		completed[:len(completed)-1], append(bytes.Clone(completed), 0),
		{1, 'c', 0, 1, 0, 1, 'A', 0, 0, 0},                          // fence 0
		{1, 'c', 0x80, 0, 1, 0, 1, 'A', 0, 0, 0},                    // fence not minimal
		{1, 'c', 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10, 1}, // fence 2^53
		{1, 'c', 1, 1, 0, 1, 'A', 0, 0},                             // completed without its result
		{1, 'c', 1, 1, 0, 0xff, 4, 0, 0, 0, 0},                      // packed token too short
	}
}

// FuzzDecodeRecord: any bytes decode to a record or an error wrapping
// ErrCorrupt (never a panic), and a value that decodes is the one
// encoding of its fields.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range append(recordSeeds(), stepSeeds()...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		rec, err := DecodeRecord(v)
		s, why := parseValue(string(v))
		switch {
		case why != "":
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeRecord(%q) = %+v, %v; want ErrCorrupt (%s)", v, rec, err, why)
			}
			return
		case s.state == stReleased:
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("released record: %v, want ErrNotFound", err)
			}
		case err != nil:
			t.Fatalf("DecodeRecord(%q) = %v, but it parses", v, err)
		case rec.State < StatePending || rec.State > StateFailed || rec.Fence < 1 || rec.Fence > RedisMaxFence ||
			rec.Attempt < 1 || rec.Token == "":
			t.Fatalf("DecodeRecord accepted %q as %+v", v, rec)
		case rec.State == StateCompleted && rec.Result == nil:
			t.Fatalf("completed record without its result: %q", v)
		}
		if again := encodeStored(s); !bytes.Equal(again, v) {
			t.Fatalf("%q decodes to %+v, which encodes as %q", v, s, again)
		}
		if err == nil && string(appendToken(nil, rec.Token)) != s.tok {
			t.Fatalf("token %q does not encode back to %q", rec.Token, s.tok)
		}
	})
}

func FuzzTokenCodec(f *testing.F) {
	for _, s := range []string{"A", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "77777777777777777777777777", "ABCDEFGHIJKLMNOPQRSTUVWXY", "abcdefghijklmnopqrstuvwxyz", strings.Repeat("x", 239)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		n := tokenLen(tok)
		if n == 0 {
			if tok != "" && len(tok) <= maxRawToken {
				t.Fatalf("token %q refused", tok)
			}
			return
		}
		enc := appendToken(nil, tok)
		if len(enc) != n || tokenString(string(enc)) != tok || !canonical(string(enc)) {
			t.Fatalf("token %q encodes as %q (%d bytes, want %d), decodes as %q", tok, enc, len(enc), n, tokenString(string(enc)))
		}
		if f, _, ok := kindField(string(enc), 0, 1, maxRawToken, packedTokenLen); !ok || f != string(enc) {
			t.Fatalf("encoded token %q does not read back", enc)
		}
	})
}

func FuzzDecodeClaim(f *testing.F) {
	f.Add(int64(1), int64(1), int64(1), "\x01p\x01\x01\x02fp\x01A\x00\x00\x01\x01s\x01k", uint8(5))
	f.Add(int64(3), int64(0), int64(0), "result", uint8(2))
	f.Add(int64(5), int64(3), int64(0), "boom", uint8(3))
	f.Add(int64(9), int64(0), int64(0), "", uint8(0))
	f.Fuzz(func(t *testing.T, code, a, b int64, s string, n uint8) {
		full := []any{code, a, b, b, s, nil, []any{s}}
		for _, reply := range [][]any{full[:min(int(n), len(full))], {code, s, a}, {s}, {code, a, b, b}, {code, nil}, {code, a, b, b, s}} {
			out, err := decodeClaim(reply)
			if err == nil && (out.Status < Acquired || out.Status > Exhausted) {
				t.Fatalf("decodeClaim(%v) = %+v", reply, out)
			}
			if err == nil && out.Status == Acquired && (out.Lease.Fence < 1 || out.Lease.Attempt < 1) {
				t.Fatalf("decodeClaim(%v) = %+v", reply, out)
			}
		}
	})
}

// Validate's answer for keys on and off its printable-ASCII fast path.
func TestKeyValidateParts(t *testing.T) {
	for _, c := range []struct {
		id string
		ok bool
	}{
		{"orders/1-0", true}, {" ~", true}, {"é", true}, {strings.Repeat("x", MaxIDLen), true},
		{"a\x7fb", false}, {"a\x1fb", false}, {"a\nb", false}, {"\x00", false}, {"a\u0085b", false}, {"\xff", false},
		{"", false}, {strings.Repeat("x", MaxIDLen+1), false},
	} {
		if err := (Key{Scope: "s", ID: c.id}).Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(id %q) = %v, want ok %v", c.id, err, c.ok)
		}
		if err := (Key{Scope: c.id, ID: "x"}).Validate(); c.id != "" && len(c.id) < 64 && (err == nil) != c.ok {
			t.Errorf("Validate(scope %q) = %v, want ok %v", c.id, err, c.ok)
		}
	}
}
