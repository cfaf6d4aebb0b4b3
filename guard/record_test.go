package guard

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/scripts"
)

// luaDecode runs record.lua on the value at KEYS[1] and returns what it
// read: the reason it refused the value, or the fields as strings.
var luaDecode = scripts.WithRecord(`
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
if bad then return {bad} end
if not v then return {'absent'} end
local n, i = uvar(v, ep)
local body = ''
if st == 'p' or st == 'f' then body = sub(v, kp) elseif st == 'c' then body = sub(v, rp) end
return {'', st, rcv and 1 or 0, fence, att, sub(v, fp, tp - 1), tok, sub(v, pp, ep - 1), sub(v, i, i + n - 1),
  ret or 0, body}`)

// goDecode is the same from the Go decoder.
func goDecode(v []byte) []any {
	s, why := parseValue(string(v))
	if why != "" {
		return []any{why}
	}
	rcv := int64(0)
	if s.recovered {
		rcv = 1
	}
	body := ""
	switch s.state {
	case stPending, stFailed:
		body = string(appendKey(nil, Key{Scope: s.scope, ID: s.id}))
	case stCompleted:
		body = s.result
	}
	return []any{"", string(s.state), rcv, s.fence, s.attempt, s.fp, s.tok, s.ptok, s.lastErr, s.retention, body}
}

// codecValues are the seeds and, from a fixed seed, n mutations of them:
// bytes changed, cut, inserted, removed.
func codecValues(n int) [][]byte {
	seeds := recordSeeds()
	out := append([][]byte(nil), seeds...)
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		v := bytes.Clone(seeds[r.IntN(len(seeds))])
		for range 1 + r.IntN(3) {
			switch op := r.IntN(4); {
			case op == 0 && len(v) > 0:
				v[r.IntN(len(v))] = byte(r.IntN(256))
			case op == 1 && len(v) > 0:
				v = v[:r.IntN(len(v))]
			case op == 2:
				i := r.IntN(len(v) + 1)
				v = append(v[:i], append([]byte{byte(r.IntN(256))}, v[i:]...)...)
			case op == 3 && len(v) > 0:
				i := r.IntN(len(v))
				v = append(v[:i], v[i+1:]...)
			}
		}
		out = append(out, v)
	}
	return out
}

// TestRecordCodecParity holds scripts/record.lua and the Go decoder to one
// another: on every value both refuse it for the same reason or read the
// same fields, on miniredis and on Redis.
func TestRecordCodecParity(t *testing.T) {
	values := codecValues(3000)
	onLuaServers(t, func(t *testing.T, c redis.UniversalClient) {
		refused := decodedAlike(t, c, testenv.Prefix(t)+"{parity}", values, t.Fatalf)
		if refused == 0 || refused == len(values) {
			t.Fatalf("%d of %d values refused: the mutations do not cover both sides", refused, len(values))
		}
		t.Logf("%d values, %d refused", len(values), refused)
	})
}

// onLuaServers runs check on miniredis and on Redis, the two servers
// whose Lua the scripts are held to.
func onLuaServers(t *testing.T, check func(t *testing.T, c redis.UniversalClient)) {
	for _, srv := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"miniredis", func(t *testing.T) redis.UniversalClient {
			mr := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}},
		{"redis", func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }},
	} {
		t.Run(srv.name, func(t *testing.T) { check(t, srv.client(t)) })
	}
}

// decodedAlike stores each of values at key on c and reports, through
// report, a value that record.lua and the Go decoder do not read alike
// (the same fields, or the same refusal); it returns how many both
// refused, and deletes key.
func decodedAlike(t *testing.T, c redis.UniversalClient, key string, values [][]byte, report func(format string, args ...any)) (refused int) {
	t.Helper()
	ctx := context.Background()
	defer c.Del(ctx, key)
	for _, v := range values {
		if err := c.Set(ctx, key, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := luaDecode.Run(ctx, c, []string{key}).Slice()
		if err != nil {
			t.Fatalf("record.lua on %q: %v", v, err)
		}
		want := goDecode(v)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			report("value %q:\nlua %q\ngo  %q", v, got, want)
		}
		if want[0] != "" {
			refused++
		}
	}
	return refused
}

// FuzzRecordCodecParity is TestRecordCodecParity over any bytes, on
// miniredis.
func FuzzRecordCodecParity(f *testing.F) {
	for _, v := range recordSeeds() {
		f.Add(v)
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		f.Fatal(err)
	}
	defer mr.Close()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, v []byte) {
		if err := c.Set(ctx, "{parity}", v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := luaDecode.Run(ctx, c, []string{"{parity}"}).Slice()
		if err != nil {
			t.Fatalf("record.lua on %q: %v", v, err)
		}
		if want := goDecode(v); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("value %q:\nlua %q\ngo  %q", v, got, want)
		}
	})
}

// TestPendingValueLayout: the first attempt's record the native claim
// writes is what the claim script writes for the same claim.
func TestPendingValueLayout(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	s := NewRedisStore(c, RedisOptions{Unpipelined: true})
	ctx := context.Background()
	for _, req := range []ClaimRequest{
		{Key: Key{Scope: "tenant-42/POST /orders", ID: "9f2c"}, Token: newToken(), Fingerprint: strings.Repeat("ab", 32), Lease: 30e9, TTL: 86400e9},
		{Key: Key{Scope: "s", ID: strings.Repeat("é", 100)}, Token: "A", Fingerprint: "", Lease: 1e6, TTL: 1e6},
	} {
		p, _, err := newPending(req, 0)
		if err != nil {
			t.Fatal(err)
		}
		name := s.Name(req.Key)
		// The script's path for an absent key.
		mr.Del(name)
		reply, err := s.script(ctx, scripts.Claim, []any{evalsha, nil, 1, name, p.tokEnc(), p.fpEnc(), ms(req.Lease), p.retention, 0, p.keyEnc()}).Slice()
		if err != nil || len(reply) != 5 || reply[0] != int64(1) || reply[4] != string(p.buf) {
			t.Fatalf("claim script: %q, %v", reply, err)
		}
		v, err := c.Get(ctx, name).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(v, p.buf) {
			t.Fatalf("claim script wrote %q, the native claim writes %q", v, p.buf)
		}
		if ttl := mr.TTL(name); ttl.Milliseconds() != p.ttl {
			t.Fatalf("claim script's TTL %s, the native claim's %dms", ttl, p.ttl)
		}
	}
}
