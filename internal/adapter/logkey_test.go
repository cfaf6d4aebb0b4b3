package adapter

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

func TestLogKey(t *testing.T) {
	k := guard.Key{Scope: "POST /pay", ID: "0190f5c4-uuid"}
	d := metrics.KeyDigest(k)
	if len(d) != 12 {
		t.Fatalf("digest %q", d)
	}
	if got := LogKey(k, false); !reflect.DeepEqual(got, []any{"key", d}) {
		t.Fatalf("redacted: %v", got)
	}
	if got := LogKey(k, true); !reflect.DeepEqual(got, []any{"key", d, "scope", k.Scope, "id", k.ID}) {
		t.Fatalf("full: %v", got)
	}
}

func TestLogErr(t *testing.T) {
	long := guard.Key{Scope: "POST /pay", ID: "0190f5c4-uuid"}
	short := guard.Key{Scope: "POST /pay", ID: "k1"}
	hidden := func(k guard.Key) string { return "<key " + metrics.KeyDigest(k) + ">" }
	cases := []struct {
		name string
		k    guard.Key
		err  error
		full bool
		want string
	}{
		{"nil", long, nil, false, ""},
		{"scope/id and bare id", long, fmt.Errorf("claim %s: id %s: %w", long, long.ID, guard.ErrUnavailable), false,
			"claim POST /pay/" + hidden(long) + ": id " + hidden(long) + ": " + guard.ErrUnavailable.Error()},
		{"short id: only its scope/id form", short, fmt.Errorf("claim %s: k1 is short", short), false,
			"claim POST /pay/" + hidden(short) + ": k1 is short"},
		{"full", long, fmt.Errorf("claim %s", long), true, "claim " + long.String()},
		{"no id", guard.Key{Scope: "s"}, errors.New("empty key"), false, "empty key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := LogErr(tc.k, tc.err, tc.full)
			if got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
			if !tc.full && tc.k.ID != "" && len(tc.k.ID) >= 8 && strings.Contains(got, tc.k.ID) {
				t.Fatalf("%q still names the id", got)
			}
		})
	}
}
