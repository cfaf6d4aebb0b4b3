package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

func TestBenchLoadAverage(t *testing.T) {
	code, out, stderr := cli(t, "bench", "--scenario", "replay", "--concurrency", "2", "--ops", "20", "--keys", "5")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	if !regexp.MustCompile(`load average \(1, 5, 15 min\) \S+ \S+ \S+ before, \S+ \S+ \S+ after`).MatchString(out) {
		t.Errorf("no load average with the table:\n%s", out)
	}
	if !strings.Contains(out, "| get-auto | miniredis | 2 |") || !strings.Contains(out, "(baseline of replay)") ||
		!strings.Contains(out, "× get-auto") {
		t.Errorf("replay is not paired with get-auto:\n%s", out)
	}
}

// The memory scenario on a Redis of its own: bytes per completed record
// with a 200-byte result, and the sizing table.
func TestBenchMemory(t *testing.T) {
	srv := testenv.StartRedis(t)
	code, out, stderr := cli(t, "bench", "--target", srv.Addr(), "--scenario", "memory", "--records", "20000")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	m := regexp.MustCompile(`20000 completed records with a 200-byte result: (\d+) bytes of Redis memory each \(used_memory less clients' buffers \d+ → \d+\); the value itself is 243 bytes`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output:\n%s", out)
	}
	// 394 on Redis 7.0.15: the 243-byte value in jemalloc's 256-byte
	// class, the 30-character name in 32 bytes, the dict entries and
	// tables (the target: at most 400).
	if n, _ := strconv.Atoi(m[1]); n > 400 || n < 300 {
		t.Errorf("%d bytes per completed record, want 300 to 400", n)
	}
	if !strings.Contains(out, "| new keys/s | kept 24 h |") || !strings.Contains(out, "| 100000 |") {
		t.Errorf("no sizing table:\n%s", out)
	}
}

func TestBenchMemoryBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"--scenario", "memory,fresh"}, "--scenario memory runs alone"},
		{[]string{"--scenario", "memory"}, "needs --target host:port"},
		{[]string{"--scenario", "memory", "--target", "x:1", "--records", "0"}, "--records 0"},
	} {
		code, _, stderr := cli(t, append([]string{"bench"}, c.args...)...)
		wantError(t, code, stderr, 2, c.text)
	}
}

// --cpuprofile writes a profile pprof reads (gzipped protobuf) and
// refuses a file it cannot create.
func TestBenchCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	code, out, stderr := cli(t, "bench", "--scenario", "replay", "--concurrency", "2", "--ops", "20", "--keys", "5", "--cpuprofile", path)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("%s is not a gzipped profile: % x", path, b[:min(len(b), 8)])
	}
	code, _, stderr = cli(t, "bench", "--scenario", "replay", "--ops", "20", "--cpuprofile", filepath.Join(t.TempDir(), "missing", "cpu.prof"))
	if code == 0 || !strings.Contains(stderr, "cpu.prof") {
		t.Errorf("an uncreatable profile file: exit %d, stderr %q", code, stderr)
	}
}
