package guard_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestStepCost measures what steps cost on Redis (7.0 here), on a server
// of the test's own: the bytes a step adds to a pending record, Redis's
// time per step, and that a completed record costs the same whether its
// key used steps or not (asserted: the values are byte for byte the same
// length and MEMORY USAGE agrees). The figures are logged for the README.
func TestStepCost(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client()
	s := guard.NewRedisStore(c, guard.RedisOptions{Unpipelined: true})
	if err := s.LoadScripts(bg); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	fp := sha256.Sum256([]byte("request"))
	req := func(set string, i int) guard.ClaimRequest {
		return guard.ClaimRequest{Key: guard.Key{Scope: "tenant-42/POST /checkout", ID: fmt.Sprintf("%s-%08d-5a7d-4b8e-9f51-2c1d5f6a7b80", set, i)},
			Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: hex.EncodeToString(fp[:]), Lease: 30 * time.Second, TTL: 24 * time.Hour}
	}
	usage := func(set string) (strlen, mem float64) {
		for i := range n {
			name := s.Name(req(set, i).Key)
			strlen += float64(c.StrLen(bg, name).Val())
			mem += float64(c.MemoryUsage(bg, name).Val())
		}
		return strlen / n, mem / n
	}
	steps := []guard.StepResult{
		{Name: "reserve", Result: []byte(`{"reservation":"res_4f2a9c","sku":"tea-42","qty":1}`)},
		{Name: "charge", Result: []byte(strings.Repeat("c", 200))},
		{Name: "order", Result: []byte(`{"order":"ord_9d1e77"}`)},
	}
	result := []byte(strings.Repeat("r", 200))

	leases := map[string][]guard.Lease{}
	for _, set := range []string{"plain", "steps"} {
		for i := range n {
			out, err := s.Claim(bg, req(set, i))
			if err != nil || out.Status != guard.Acquired {
				t.Fatal(out, err)
			}
			leases[set] = append(leases[set], out.Lease)
		}
	}
	l0, m0 := usage("steps")
	t.Logf("pending record, no step: %.0f bytes of value, MEMORY USAGE %.0f", l0, m0)
	if err := c.ConfigResetStat(bg).Err(); err != nil {
		t.Fatal(err)
	}
	for k, st := range steps {
		for i := range n {
			if err := s.SaveStep(bg, leases["steps"][i], k, st); err != nil {
				t.Fatal(err)
			}
		}
		l, m := usage("steps")
		t.Logf("after step %d (%q, %d-byte result): %.0f bytes of value (+%.0f), MEMORY USAGE %.0f (+%.0f)",
			k+1, st.Name, len(st.Result), l, l-l0, m, m-m0)
		l0, m0 = l, m
	}
	stats := commandStats(t, c)
	ev := stats["evalsha"]
	t.Logf("Redis time per step (step.lua: GET, SET KEEPTTL, decoding): %.2fµs (%d calls; inner GET %d, SET %d)",
		float64(ev.usec)/float64(ev.calls), ev.calls, stats["get"].calls, stats["set"].calls)
	if ev.calls != 3*n || stats["get"].calls != 3*n || stats["set"].calls != 3*n {
		t.Fatalf("a step is one EVALSHA with one GET and one SET inside: %v", stats)
	}

	if err := c.ConfigResetStat(bg).Err(); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"plain", "steps"} {
		for _, l := range leases[set] {
			if err := s.Complete(bg, l, result, 24*time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if set == "plain" {
			ev := commandStats(t, c)["evalsha"]
			t.Logf("Redis time per complete, key without steps: %.2fµs", float64(ev.usec)/float64(ev.calls))
			_ = c.ConfigResetStat(bg).Err()
		} else {
			ev := commandStats(t, c)["evalsha"]
			t.Logf("Redis time per complete, key with 3 steps: %.2fµs", float64(ev.usec)/float64(ev.calls))
		}
	}
	pl, pm := usage("plain")
	sl, sm := usage("steps")
	t.Logf("completed record with a 200-byte result: %.0f bytes of value, MEMORY USAGE %.0f without steps; %.0f, %.0f after 3 steps",
		pl, pm, sl, sm)
	if pl != sl || pm != sm {
		t.Fatalf("a completed record of a key that used steps costs %.0f/%.0f bytes, one without %.0f/%.0f", sl, sm, pl, pm)
	}
	for i := range n {
		if rec, err := s.Get(bg, req("steps", i).Key); err != nil || rec.Steps != nil || string(rec.Result) != string(result) {
			t.Fatalf("completed record %d: %+v, %v", i, rec, err)
		}
	}
}
