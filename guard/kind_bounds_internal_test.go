package guard

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestKindBytesParity: for every value of the kind byte that leads
// the fingerprint, the token and the ptok (followed by as many bytes as
// the kind says: 16 or 17 for 255), scripts/record.lua and the Go decoder
// agree, on miniredis and on Redis: the same reading, or the same refusal
// (record.lua's header: fingerprint kind 0..16 or 255, token 1..239 or
// 255, ptok 0..239 or 255; "Anything else is corrupt"). The random
// mutations of TestRecordCodecParity seldom keep a value readable while
// changing a kind byte to a length that fits. (A mutation review:
// record.lua reading a fingerprint of kind 17 passed every test.)
func TestKindBytesParity(t *testing.T) {
	field := func(k int) []byte {
		n := k
		switch k {
		case 255:
			return append([]byte{255, 16}, bytes.Repeat([]byte{'x'}, 16)...) // [255, a byte, 15 more]: 16 after the kind
		}
		return append([]byte{byte(n)}, bytes.Repeat([]byte{'y'}, n)...)
	}
	packed := func(k int) []byte { // a token field: 255 packs 17 bytes, the first at most 3
		if k == 255 {
			return append([]byte{255, 1}, bytes.Repeat([]byte{'z'}, 16)...)
		}
		return field(k)
	}
	digest := func(k int) []byte { // a fingerprint field: 255 is a 16-byte digest
		if k == 255 {
			return append([]byte{255}, bytes.Repeat([]byte{'d'}, 16)...)
		}
		return field(k)
	}
	// A completed record, fence 1, attempt 1, no last error, result "r".
	completed := func(fp, tok, ptok []byte) []byte {
		v := []byte{1, 'c', 1, 1}
		v = append(v, fp...)
		v = append(v, tok...)
		v = append(v, ptok...)
		return append(v, 0, 1, 'r')
	}
	var values [][]byte
	for k := range 256 {
		values = append(values,
			completed(digest(k), packed(3), packed(0)),
			completed(digest(2), packed(k), packed(0)),
			completed(digest(2), packed(3), packed(k)))
	}
	onLuaServers(t, func(t *testing.T, c redis.UniversalClient) {
		refused := decodedAlike(t, c, testenv.Prefix(t)+"{kinds}", values, t.Errorf)
		// 17..254 for the fingerprint, 0 and 240..254 for the token,
		// 240..254 for the ptok.
		if want := 238 + 16 + 15; refused != want {
			t.Errorf("%d values refused, want %d", refused, want)
		}
	})
}

// TestFingerprintKind17Corrupt: a pending record whose fingerprint
// kind byte is 17 is corrupt; its holder's Fail, Extend, Complete and
// Release fail with ErrCorrupt and leave the value as it is (the
// contract's CorruptRecords: "every call on such a key must fail with an
// error wrapping guard.ErrCorrupt ... and change nothing").
func TestFingerprintKind17Corrupt(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	s := NewRedisStore(c, RedisOptions{})
	ctx := context.Background()
	key := Key{Scope: "s", ID: "fp17"}
	out, err := s.Claim(ctx, ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	name := s.Name(key)
	v, err := c.Get(ctx, name).Result()
	if err != nil || !strings.HasPrefix(v, "\x01p\x01\x01\x02fp") {
		t.Fatalf("pending record %q, %v", v, err)
	}
	bad := v[:4] + "\x11" + strings.Repeat("f", 17) + v[7:]
	if err := c.Set(ctx, name, bad, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	hand := Lease{Key: key, Token: "A"} // a lease without the pending record: the scripts decode
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"Fail", func() error { return s.Fail(ctx, hand, "boom", time.Hour) }},
		{"Extend", func() error { return s.Extend(ctx, hand, time.Hour) }},
		{"Complete", func() error { return s.Complete(ctx, hand, []byte("r"), time.Hour) }},
		{"Release", func() error { return s.Release(ctx, hand) }},
	} {
		if err := call.do(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s on a record with fingerprint kind 17 = %v, want ErrCorrupt", call.name, err)
		}
		if got, err := c.Get(ctx, name).Result(); err != nil || got != bad {
			t.Fatalf("value after %s = %q, %v; want it unchanged", call.name, got, err)
		}
	}
}
