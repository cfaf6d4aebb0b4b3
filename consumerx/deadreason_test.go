package consumerx_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemguard/idemguard/consumerx"
)

// DeadLetterReason keeps a short cause whole, and cuts a long one to
// MaxDeadLetterReason bytes on a UTF-8 boundary, marked.
func TestDeadLetterReason(t *testing.T) {
	if got := consumerx.DeadLetterReason(errors.New("card declined")); got != "card declined" {
		t.Errorf("short cause: %q", got)
	}
	if got := consumerx.DeadLetterReason(nil); got != "" {
		t.Errorf("nil cause: %q", got)
	}
	for _, fill := range []string{"a", "é", "€", "𝄞"} {
		long := errors.New(strings.Repeat(fill, 3*consumerx.MaxDeadLetterReason))
		got := consumerx.DeadLetterReason(long)
		if len(got) > consumerx.MaxDeadLetterReason || !utf8.ValidString(got) || !strings.HasSuffix(got, "…(truncated)") ||
			len(got) < consumerx.MaxDeadLetterReason-utf8.UTFMax {
			t.Errorf("long cause of %q: %d bytes, valid %v, %q…", fill, len(got), utf8.ValidString(got), got[len(got)-20:])
		}
	}
}
