package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestOperatorCommandsOnHandWrittenRecords: records written by
// hand in format 2 (steps) and in a format this build does not know
// (version 3) go through inspect (by key and by Redis name), list and
// release: the steps are shown and kept by release, which fails the
// holder's attempt in format 2; the unknown record is named unreadable by
// every command and left as it was.
func TestOperatorCommandsOnHandWrittenRecords(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := g.Store().(*guard.RedisStore)
	uv := func(n int) []byte {
		var b []byte
		for n >= 0x80 {
			b = append(b, byte(n)|0x80)
			n >>= 7
		}
		return append(b, byte(n))
	}
	str := func(s string) []byte { return append(uv(len(s)), s...) }
	// A pending record (fence 130, attempt 2, token "holder", last error
	// "x", retention 1 h) with two steps, version 2.
	pending := func(ver byte, key guard.Key) []byte {
		b := []byte{ver, 'p'}
		b = append(b, uv(130)...)
		b = append(b, 2, 2, 'f', 'p', 6)
		b = append(b, "holder"...)
		b = append(b, 0)
		b = append(b, str("x")...)
		b = append(b, uv(3_600_000)...)
		b = append(append(b, str(key.Scope)...), str(key.ID)...)
		b = append(append(b, str("reserve")...), str("r-1")...)
		return append(append(b, str("charge")...), str("c-22")...)
	}
	stepsKey := guard.Key{Scope: "POST /orders", ID: "v2-steps"}
	futureKey := guard.Key{Scope: "POST /orders", ID: "v3"}
	// The lease ran out a minute ago: PTTL = retention - 1 min.
	if err := rdb.Set(ctx, s.Name(stepsKey), pending(2, stepsKey), time.Hour-time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	future := pending(3, futureKey)
	if err := rdb.Set(ctx, s.Name(futureKey), future, time.Hour-time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), s.Name(stepsKey), s.Name(futureKey)) })

	code, out, errOut := cli(t, "inspect", "--redis", addr, "--prefix", prefix, stepsKey.Scope, stepsKey.ID)
	if code != 0 || !strings.Contains(out, "reserve (3 bytes), charge (4 bytes)") || !strings.Contains(out, "fence        130") {
		t.Errorf("inspect of a record with steps: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, "inspect", "--redis", addr, "--prefix", prefix, s.Name(stepsKey))
	if code != 0 || !strings.Contains(out, "reserve (3 bytes), charge (4 bytes)") || !strings.Contains(out, "v2-steps") {
		t.Errorf("inspect by name of a record with steps: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, "inspect", "--redis", addr, "--prefix", prefix, futureKey.Scope, futureKey.ID)
	if code != 1 || !strings.Contains(out+errOut, "unknown version") {
		t.Errorf("inspect of a version 3 record: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, "list", "--redis", addr, "--prefix", prefix, "--format", "json")
	if code != 1 || !strings.Contains(out, `"id":"v2-steps"`) || !strings.Contains(errOut, "1 records could not be read") {
		t.Errorf("list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, "release", "--redis", addr, "--prefix", prefix, futureKey.Scope, futureKey.ID)
	if code != 1 || !strings.Contains(errOut, "unknown version") {
		t.Errorf("release of a version 3 record: exit %d\n%s%s", code, out, errOut)
	}
	if got, _ := rdb.Get(ctx, s.Name(futureKey)).Result(); got != string(future) {
		t.Errorf("the version 3 record changed: %q", got)
	}
	code, out, errOut = cli(t, "release", "--redis", addr, "--prefix", prefix, stepsKey.Scope, stepsKey.ID)
	if code != 0 {
		t.Fatalf("release of a record with steps whose lease ran out: exit %d\n%s%s", code, out, errOut)
	}
	rec, err := s.Get(ctx, stepsKey)
	if err != nil || rec.State != guard.StateFailed || rec.Fence != 130 || rec.Attempt != 2 || len(rec.Steps) != 2 ||
		rec.Steps[1].Name != "charge" || string(rec.Steps[1].Result) != "c-22" || !strings.Contains(rec.LastError, "released by an operator") {
		t.Fatalf("after release: %+v, %v", rec, err)
	}
	// The next claim takes it over with fence 131 and both steps.
	out2, err := g.Claim(ctx, stepsKey, "fp")
	if err != nil || out2.Status != guard.Acquired || out2.Lease.Fence != 131 || len(out2.Steps) != 2 {
		t.Fatalf("claim after release: %+v, %v", out2, err)
	}
	_ = g.Release(ctx, out2.Lease)
}
