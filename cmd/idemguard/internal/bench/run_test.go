package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openMini(t *testing.T) *Target {
	t.Helper()
	tg, err := Open(context.Background(), TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.Close)
	return tg
}

func openRedis(t *testing.T) *Target {
	t.Helper()
	tg, err := Open(context.Background(), TargetOptions{Addr: testenv.RedisAddr(t), Prefix: testenv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.Close)
	return tg
}

// Every scenario runs on the embedded miniredis with a fixed count and
// reports figures that add up.
func TestEveryScenarioMiniredis(t *testing.T) {
	tg := openMini(t)
	opts := Options{Concurrency: 4, Ops: 60, Keys: 15, Duplicates: 4}
	results, err := tg.RunAll(context.Background(), Scenarios(), []int{4}, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if plan := Plan(Scenarios()); len(results) != len(plan) {
		t.Fatalf("%d rows, want %d (%v)", len(results), len(plan), plan)
	}
	// Each guard row ran right after its baseline, and its ratio is
	// taken between the two.
	for i, r := range results {
		base := Baseline(r.Scenario)
		if base == "" {
			continue
		}
		if i == 0 || results[i-1].Scenario != base || results[i-1].Partner != r.Scenario {
			t.Errorf("%s did not run right after its baseline %s", r.Scenario, base)
			continue
		}
		if want := r.OpsPerSec() / results[i-1].OpsPerSec(); r.Ratio != want || Ratio(r, results) != want {
			t.Errorf("%s: ratio %v, want %v", r.Scenario, r.Ratio, want)
		}
	}
	for _, r := range results {
		want := int64(60)
		if IsStorm(r.Scenario) {
			want = 15 * 4
		}
		if r.Ops != want || r.Latency.Count() != uint64(want) {
			t.Errorf("%s: %d ops, %d samples, want %d", r.Scenario, r.Ops, r.Latency.Count(), want)
		}
		if r.OpsPerSec() <= 0 || r.Latency.Quantile(0.99) <= 0 {
			t.Errorf("%s: %.0f ops/s, p99 %v", r.Scenario, r.OpsPerSec(), r.Latency.Quantile(0.99))
		}
		if !math.IsNaN(r.CommandsPerOp) {
			t.Errorf("%s: miniredis has no commandstats, got %v cmds/op", r.Scenario, r.CommandsPerOp)
		}
	}
	// Round trips per operation, counted at the client.
	// At 4 workers every call of a pipelined store goes straight out.
	trips := map[string]float64{Fresh: 2, FreshUnpipelined: 2, ClaimComplete: 2, Replay: 1, ReplayUnpipelined: 1, SetNXSet: 2, SetNXSetPipe: 1, Get: 1, HTTP: 2, HTTPReplay: 1, HTTPPlain: 0,
		ConsumerPlain: 3}
	for _, r := range results {
		if w, ok := trips[r.Scenario]; ok && r.RoundTripsPerOp != w {
			t.Errorf("%s: %.3f round trips/op, want %v", r.Scenario, r.RoundTripsPerOp, w)
		}
		// A batch of 16: the plain row's three, and two for the guard,
		// its claims and its completions, each a pipeline of its own.
		if r.Scenario == Consumer && r.RoundTripsPerOp != 5 {
			t.Errorf("%s: %.3f round trips/op, want 5", r.Scenario, r.RoundTripsPerOp)
		}
	}
	for _, r := range results {
		guarded := r.Scenario == Storm || r.Scenario == StormUnpipelined || r.Scenario == ConsumerStorm
		if guarded && (r.Effects != 15 || r.DuplicateEffects != 0) {
			t.Errorf("%s: %d effects (%d duplicates) for 15 keys", r.Scenario, r.Effects, r.DuplicateEffects)
		}
		if guarded && r.Replays+r.Conflicts+r.Effects != r.Ops {
			t.Errorf("guard storm: replays %d + conflicts %d + effects %d != %d ops", r.Replays, r.Conflicts, r.Effects, r.Ops)
		}
		if r.Scenario == Replay && r.Effects != 0 {
			t.Errorf("replay ran %d effects", r.Effects)
		}
		if (r.Scenario == HTTPGetAuto || r.Scenario == HTTPSetNXSetAuto) && r.RoundTripsPerOp == 0 {
			t.Errorf("%s: no round trip to Redis", r.Scenario)
		}
	}
	if n, _ := tg.client.DBSize(context.Background()).Result(); n != 0 {
		t.Errorf("%d keys left behind", n)
	}
}

// On real Redis, the guard's storm runs each key's effect exactly once
// while the naive GET-then-SETEX pattern runs duplicates, and commands per
// operation come from INFO commandstats.
func TestStormRedis(t *testing.T) {
	tg := openRedis(t)
	results, err := tg.RunAll(context.Background(), []string{Storm, FreshUnpipelined}, []int{64}, Options{Concurrency: 64, Keys: 200, Duplicates: 8, Work: 2 * time.Millisecond, Ops: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rowNames(results)); got != "[naive-storm-auto storm setnx+set fresh-unpipelined]" {
		t.Fatalf("rows %s", got)
	}
	naive, guardRow, fresh := results[0], results[1], results[3]
	if guardRow.Effects != 200 || guardRow.DuplicateEffects != 0 {
		t.Errorf("guard storm: %d effects, %d duplicates; want 200, 0", guardRow.Effects, guardRow.DuplicateEffects)
	}
	if naive.DuplicateEffects == 0 || naive.Effects != 200+naive.DuplicateEffects {
		t.Errorf("naive storm: %d effects, %d duplicates: the race was not seen", naive.Effects, naive.DuplicateEffects)
	}
	// Other clients share the server, so commands/op is at least the
	// guard's own: SET NX GET, and complete.lua's EVALSHA with a GET and a
	// SET inside.
	if math.IsNaN(fresh.CommandsPerOp) || fresh.CommandsPerOp < 4 {
		t.Errorf("fresh: %v redis commands/op, want at least 4 (SET, EVALSHA, and 2 inside)", fresh.CommandsPerOp)
	}
	if fresh.Ratio <= 0 || fresh.RoundTripsPerOp != 2 {
		t.Errorf("fresh-unpipelined: ratio %v, %v round trips/op; want a ratio, 2", fresh.Ratio, fresh.RoundTripsPerOp)
	}
	n, err := tg.client.Keys(context.Background(), tg.prefix+"*").Result()
	if err != nil || len(n) != 0 {
		t.Errorf("keys left behind: %d (%v)", len(n), err)
	}
}

// The http floors make the native calls they stand for, and nothing
// more: a GET per request, a SET NX and a SET per request.
func TestHTTPFloorsRedis(t *testing.T) {
	tg := openRedis(t)
	results, err := tg.RunAll(context.Background(), []string{HTTPGetAuto, HTTPSetNXSetAuto}, []int{8}, Options{Concurrency: 8, Keys: 50, Ops: 400}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rowNames(results)); got != "[http-plain http-get-auto http-plain http-setnx+set-auto]" {
		t.Fatalf("rows %s", got)
	}
	// Other clients share the server: at least the floor's own commands.
	for _, c := range []struct {
		r    Result
		want float64
	}{{results[1], 1}, {results[3], 2}} {
		if math.IsNaN(c.r.CommandsPerOp) || c.r.CommandsPerOp < c.want || c.r.Ratio <= 0 {
			t.Errorf("%s: %v redis commands/op (want at least %v), ratio %v", c.r.Scenario, c.r.CommandsPerOp, c.want, c.r.Ratio)
		}
	}
	n, err := tg.client.Keys(context.Background(), tg.prefix+"*").Result()
	if err != nil || len(n) != 0 {
		t.Errorf("keys left behind: %d (%v)", len(n), err)
	}
}

func TestTableAndChart(t *testing.T) {
	tg := openMini(t)
	results, err := tg.RunAll(context.Background(), []string{Fresh, SetNXSet, Storm, NaiveStorm}, []int{2, 4},
		Options{Ops: 40, Keys: 10, Duplicates: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, results); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2+len(results) {
		t.Fatalf("%d table lines for %d rows:\n%s", len(lines), len(results), buf.String())
	}
	// Plan: setnx+set-auto, fresh, setnx+set, naive-storm-auto, storm,
	// naive-storm; for 2 workers, then 4.
	if !strings.HasPrefix(lines[2], "| setnx+set-auto | miniredis | 2 |") || !strings.Contains(lines[2], "(baseline of fresh)") {
		t.Errorf("baseline row: %s", lines[2])
	}
	if !strings.Contains(lines[3], "× setnx+set-auto") || !strings.HasPrefix(lines[3], "| fresh | miniredis | 2 |") {
		t.Errorf("fresh row: %s", lines[3])
	}
	dir := t.TempDir()
	for _, name := range []string{"c.svg", "c.png"} {
		p := filepath.Join(dir, name)
		if err := WriteChart(p, results); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil || st.Size() < 1000 {
			t.Fatalf("%s: %v, %d bytes", name, err, st.Size())
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "c.svg"))
	if !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), "throughput") {
		t.Error("svg lacks its title")
	}
	if err := WriteChart(filepath.Join(dir, "c.txt"), results); err == nil {
		t.Error("a .txt chart was accepted")
	}
}

func TestBadInput(t *testing.T) {
	tg := openMini(t)
	ctx := context.Background()
	if _, err := tg.Run(ctx, "nope", Options{}); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Errorf("unknown scenario: %v", err)
	}
	if _, err := tg.Run(ctx, Fresh, Options{Concurrency: -1}); err == nil {
		t.Error("negative concurrency accepted")
	}
	if _, err := tg.RunAll(ctx, []string{Fresh}, []int{0}, Options{}, nil); err == nil {
		t.Error("zero concurrency accepted")
	}
	if _, err := Open(ctx, TargetOptions{Addr: "127.0.0.1:" + itoa(testenv.FreePort(t))}); err == nil ||
		!strings.Contains(err.Error(), "does not answer") {
		t.Errorf("unreachable redis: %v", err)
	}
	if _, err := Open(ctx, TargetOptions{Addr: "no-port"}); err == nil {
		t.Error("an address without a port was accepted")
	}
}

func itoa(n int) string { return idOf(int64(n)) }

func rowNames(rs []Result) []string {
	var n []string
	for _, r := range rs {
		n = append(n, r.Scenario)
	}
	return n
}

// Median keeps each row's median-throughput round and the median of the
// rounds' ratios, each taken within its round.
func TestMedian(t *testing.T) {
	row := func(s string, ops int64, ratio float64) Result {
		return Result{Scenario: s, Concurrency: 64, Ops: ops, Elapsed: time.Second, Ratio: ratio}
	}
	rounds := [][]Result{
		{row(GetAuto, 100, 0), row(Replay, 60, 0.6)},
		{row(GetAuto, 50, 0), row(Replay, 40, 0.8)}, // a loaded round: both slow
		{row(GetAuto, 120, 0), row(Replay, 84, 0.7)},
	}
	m := Median(rounds)
	if len(m) != 2 || m[0].Ops != 100 || m[1].Ops != 60 || m[1].Ratio != 0.7 || m[0].Ratio != 0 {
		t.Fatalf("median %+v", m)
	}
	if r := Ratio(m[1], m); r != 0.7 {
		t.Fatalf("Ratio = %v, want the rounds' median 0.7 (not 60/100)", r)
	}
	if m[1].RatioLow != 0.6 || m[1].RatioHigh != 0.8 || m[0].RatioHigh != 0 {
		t.Fatalf("ratio range %v–%v (baseline %v), want 0.6–0.8 (none)", m[1].RatioLow, m[1].RatioHigh, m[0].RatioHigh)
	}
	var b strings.Builder
	if err := WriteTable(&b, m); err != nil || !strings.Contains(b.String(), "| 0.70× get-auto (0.60–0.80) |") {
		t.Fatalf("table %v:\n%s", err, b.String())
	}
	if one := Median(rounds[:1]); one[1].RatioHigh != 0 {
		t.Fatalf("one round: range %v–%v, want none", one[1].RatioLow, one[1].RatioHigh)
	}
}

func TestPlan(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{Fresh}, []string{SetNXSetAuto, Fresh}},
		{[]string{SetNXSetAuto, Fresh, ClaimComplete}, []string{SetNXSetAuto, Fresh, SetNXSetAuto, ClaimComplete}},
		{[]string{Get, ReplayUnpipelined, SetNXSetPipe}, []string{Get, ReplayUnpipelined, SetNXSetPipe}},
		{[]string{HTTP, HTTPReplay}, []string{HTTPPlain, HTTP, HTTPPlain, HTTPReplay}},
		{[]string{HTTPReplay, HTTPGetAuto}, []string{HTTPPlain, HTTPReplay, HTTPPlain, HTTPGetAuto}},
	} {
		if got := Plan(c.in); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Plan(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
