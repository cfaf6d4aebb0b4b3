package main

import (
	"path/filepath"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// bench --scenario memory refuses the flags it does not read, as usage
// errors: a chart or a format asked for and not made is not a success.
// (It ran, exit 0, with no chart written and a bad --format unchecked.)
func TestBenchMemoryRefusesOtherFlags(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "mem.svg")
	for _, args := range [][]string{
		{"--chart", chart},
		{"--format", "html"},
		{"--rounds", "3"},
	} {
		code, _, stderr := cli(t, append([]string{"bench", "--scenario", "memory", "--records", "10", "--target", testenv.RedisAddr(t)}, args...)...)
		wantError(t, code, stderr, 2, args[0]+": not read by --scenario memory")
	}
}
