package httpx

import (
	"math"
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"3", 3 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Sunday, 29-Nov-26 10:00:05 GMT", 5 * time.Second, true}, // RFC 850, obsolete but allowed
		{"4294967296", 4294967296 * time.Second, true},
		{"9223372037", math.MaxInt64, true}, // past what a Duration holds
		{"99999999999999999999999", math.MaxInt64, true},
		{"", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"1.5", 0, false}, {"soon", 0, false},
	}
	for _, c := range cases {
		got, ok := parseRetryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
