package guard

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzKeyValidate(f *testing.F) {
	for _, s := range [][2]string{{"s", "id"}, {"", "x"}, {"s", ""}, {"s", "a\x00b"}, {"s", strings.Repeat("é", 200)}, {"{", "}"}, {"s", "\xff"}} {
		f.Add(s[0], s[1])
	}
	st := NewRedisStore(nil, RedisOptions{})
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
		rec, lease := st.Names(k)
		if lease != rec+":lease" || strings.Count(rec, "{") != 1 || strings.Count(rec, "}") != 1 {
			t.Fatalf("names of %q: %q %q", k, rec, lease)
		}
		if again, _ := st.Names(k); again != rec {
			t.Fatalf("names not stable for %q", k)
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add("c", "fp", "tok", "1", "1", "0", "result", "", "s", "id")
	f.Add("p", "fp", "tok", "9223372036854775807", "-1", "1", "", "err", "", "")
	f.Add("x", "", "", "", "", "", "", "", "", "")
	f.Add("f", "fp", "", "0", "abc", "2", "\x00", "boom", "s", "id")
	f.Fuzz(func(t *testing.T, st, fp, tok, fen, att, rcv, res, reason, scope, id string) {
		fields := map[string]string{"st": st, "fp": fp, "tok": tok, "fen": fen, "att": att, "rcv": rcv, "res": res, "err": reason, "sc": scope, "id": id}
		rec, err := DecodeRecord(fields)
		if err != nil {
			return
		}
		if rec.State < StatePending || rec.State > StateFailed || rec.Fence < 1 || rec.Attempt < 0 || rec.Token == "" {
			t.Fatalf("DecodeRecord accepted %v as %+v", fields, rec)
		}
		// Missing fields never panic either.
		for name := range fields {
			partial := map[string]string{}
			for k, v := range fields {
				if k != name {
					partial[k] = v
				}
			}
			_, _ = DecodeRecord(partial)
		}
	})
}

func FuzzDecodeClaim(f *testing.F) {
	f.Add(int64(1), int64(1), int64(1), "", uint8(4))
	f.Add(int64(3), int64(0), int64(0), "result", uint8(2))
	f.Add(int64(5), int64(3), int64(0), "boom", uint8(3))
	f.Add(int64(9), int64(0), int64(0), "", uint8(0))
	f.Fuzz(func(t *testing.T, code, a, b int64, s string, n uint8) {
		full := []any{code, a, b, s, nil, []any{s}}
		for _, reply := range [][]any{full[:min(int(n), len(full))], {code, s, a}, {s}, {code, a, b, b}} {
			out, err := decodeClaim(reply)
			if err == nil && (out.Status < Acquired || out.Status > Exhausted) {
				t.Fatalf("decodeClaim(%v) = %+v", reply, out)
			}
		}
	})
}
