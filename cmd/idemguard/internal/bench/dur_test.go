package bench

import (
	"strings"
	"testing"
	"time"
)

// TestDurNoExponent: the table's latency columns read as a number and a
// unit, also for a value that rounds to 1000 of one (%.3g printed a p99 of
// 999.6ms as "1e+03ms").
func TestDurNoExponent(t *testing.T) {
	for _, d := range []time.Duration{
		999_600 * time.Microsecond,
		999_999 * time.Microsecond,
		999_600 * time.Millisecond,
	} {
		if s := dur(d); strings.Contains(s, "e+") || s != map[time.Duration]string{999_600 * time.Microsecond: "1s", 999_999 * time.Microsecond: "1s", 999_600 * time.Millisecond: "1000s"}[d] {
			t.Errorf("dur(%v) = %q: an exponent in the table's latency column", d, s)
		}
	}
	// The same through the table: a row whose p99 is 999.6ms.
	var h Histogram
	for range 100 {
		h.Record(999_600 * time.Microsecond)
	}
	var b strings.Builder
	if err := WriteTable(&b, []Result{{Scenario: Fresh, Concurrency: 64, Ops: 100, Elapsed: time.Second, Latency: h}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "e+03ms") {
		t.Errorf("table prints an exponent:\n%s", b.String())
	}
}
