package storetest

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// binaryValues: a fingerprint and a failure reason are strings of any
// bytes, not only text: a caller may hand a raw digest as the fingerprint
// (string(sha256.Sum256(body)[:])), and a failure's reason is an error's
// text, which may quote the bytes that broke it. A store takes them (a
// claim or failure refused for its bytes would leave the key pending for a
// lease, or unusable), tells fingerprints that differ in one byte apart,
// and gives the reason back.
func (c contract) binaryValues(t *testing.T) {
	s := c.h.New(t)
	// "\x01AA==" is text, and how a store that escapes bytes as 0x01 and
	// base64 (pgstore) might keep "\x00": the two must still differ.
	fps := []string{"\x00", "\x01AA==", "\xff", "\xfe", "a\x00b", "a\x00c", "\xc3\x28", "\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90", "\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x91"}
	keys := make([]guard.Key, len(fps))
	for i, fp := range fps {
		keys[i] = newKey(t)
		r := c.req(keys[i], "A")
		r.Fingerprint = fp
		l := acquire(t, s, r)
		if rec := get(t, s, keys[i]); !rec.SameFingerprint(fp) {
			t.Fatalf("fingerprint %q reads back as %q", fp, rec.Fingerprint)
		}
		reason := "bad byte " + fp + " in \x00\xff\xfe input"
		mustOK(t, "fail with a reason of any bytes", s.Fail(ctx, l, reason, time.Hour))
		if rec := get(t, s, keys[i]); rec.State != guard.StateFailed || rec.LastError != reason {
			t.Fatalf("failed record = %+v, want failed with reason %q", rec, reason)
		}
		r.Token = "B"
		l = acquire(t, s, r)
		mustOK(t, "complete", s.Complete(ctx, l, []byte(fp), time.Hour))
	}
	for i, fp := range fps {
		for j, other := range fps {
			r := c.req(keys[i], "C")
			r.Fingerprint = other
			out := claim(t, s, r)
			switch {
			case i == j && (out.Status != guard.Replay || string(out.Result) != fp):
				t.Fatalf("claim of %q with its own fingerprint = %+v, want replay", fp, out)
			case i != j && out.Status != guard.Mismatch:
				t.Fatalf("claim of %q with fingerprint %q = %+v, want mismatch", fp, other, out)
			}
		}
	}
}
