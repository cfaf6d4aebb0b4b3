package guard

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/scripts"
)

// luaDecodeSteps runs record.lua on the value at KEYS[1] and returns the
// reason it refused it, or its state, the steps' place and count and the
// steps' bytes.
var luaDecodeSteps = scripts.WithRecord(`
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp, sp, ns = decode(v)
if bad then return {bad} end
if not v then return {'absent'} end
local steps = ''
if sp then steps = sub(v, sp) end
return {'', st, ns or 0, steps}`)

// goDecodeSteps is the same from the Go decoder.
func goDecodeSteps(v []byte) []any {
	s, why := parseValue(string(v))
	if why != "" {
		return []any{why}
	}
	return []any{"", string(s.state), int64(len(decodeSteps(s.steps))), s.steps}
}

// stepSeeds are values with steps, valid and not.
func stepSeeds() [][]byte {
	p, _, _ := newPending(ClaimRequest{Key: Key{Scope: "tenant-42/POST /checkout", ID: "cart-7"},
		Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: strings.Repeat("f", 64), Lease: 30e9, TTL: 86400e9}, 0)
	v2 := func(v []byte, steps ...StepResult) []byte {
		out := append([]byte{recordVersionSteps}, v[1:]...)
		for _, s := range steps {
			out = appendStep(out, s)
		}
		return out
	}
	one := StepResult{Name: "reserve", Result: []byte("r-1")}
	two := StepResult{Name: strings.Repeat("n", MaxStepNameLen), Result: bytes.Repeat([]byte{0, 0xff}, 100)}
	empty := StepResult{Name: "e", Result: nil}
	fp := string(appendFingerprint(nil, "fp"))
	failed := encodeStored(stored{state: stFailed, fence: 2, attempt: 2, fp: fp, tok: "\x01B", ptok: "\x00", lastErr: "x", scope: "s", id: "i"})
	completed := encodeStored(stored{state: stCompleted, fence: 1, attempt: 1, fp: fp, tok: "\x01B", ptok: "\x00", result: "r"})
	released := encodeStored(stored{state: stReleased, fence: 1, attempt: 1, fp: fp, tok: "\x01C", ptok: "\x00"})
	return [][]byte{
		v2(p.buf, one), v2(p.buf, one, two, empty), v2(failed, two), v2(failed, empty, one),
		v2(p.buf),                             // version 2 without steps
		v2(completed, one), v2(released, one), // states that hold none
		append(v2(p.buf), 0, 0), // a step with an empty name
		appendStep(v2(p.buf), StepResult{Name: strings.Repeat("n", MaxStepNameLen+1)}),
		v2(p.buf, one)[:len(v2(p.buf, one))-1],                         // cut short
		append(v2(p.buf, one), 5),                                      // trailing byte
		append(p.buf[:len(p.buf):len(p.buf)], appendStep(nil, one)...), // steps in version 1
	}
}

// TestStepCodecParity holds record.lua and the Go decoder to one another
// on records with steps: both refuse a value for the same reason or read
// the same steps, on miniredis and on Redis, over seeds and 3,000
// mutations of them.
func TestStepCodecParity(t *testing.T) {
	seeds := stepSeeds()
	values := append([][]byte(nil), seeds...)
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		v := bytes.Clone(seeds[r.IntN(4)]) // mutate the valid ones
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
		values = append(values, v)
	}
	onLuaServers(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		key := testenv.Prefix(t) + "{parity}"
		withSteps, refused := 0, 0
		for i, v := range values {
			if err := c.Set(ctx, key, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			got, err := luaDecodeSteps.Run(ctx, c, []string{key}).Slice()
			if err != nil {
				t.Fatalf("record.lua on %q: %v", v, err)
			}
			want := goDecodeSteps(v)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("value %d %q:\nlua %q\ngo  %q", i, v, got, want)
			}
			switch {
			case want[0] != "":
				refused++
			case want[2] != int64(0):
				withSteps++
			}
			if i < 4 && (want[0] != "" || want[2] == int64(0)) {
				t.Fatalf("seed %d %q refused or without steps: %q", i, v, want)
			}
			if i >= 4 && i < len(seeds) && want[0] == "" {
				t.Fatalf("bad seed %d %q accepted: %q", i, v, want)
			}
		}
		_ = c.Del(ctx, key)
		if refused < 100 || withSteps < 100 {
			t.Fatalf("%d values refused, %d read with steps: the mutations do not cover both sides", refused, withSteps)
		}
		t.Logf("%d values, %d refused, %d with steps", len(values), refused, withSteps)
	})
}
