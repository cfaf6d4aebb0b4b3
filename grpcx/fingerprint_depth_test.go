package grpcx_test

import (
	"runtime"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemguard/idemguard/grpcx"
)

// nestedAny is a google.protobuf.Any packing an Any, depth times, with an
// empty Any at the bottom: about 45 bytes a level. It is written outside in,
// so making it costs its size, not the square of it.
func nestedAny(t testing.TB, depth int) *anypb.Any {
	t.Helper()
	const url = "type.googleapis.com/google.protobuf.Any"
	sizes := make([]int, depth+1) // sizes[k]: the encoding of level k
	for k := depth - 1; k >= 0; k-- {
		v := sizes[k+1]
		sizes[k] = protowire.SizeTag(1) + protowire.SizeBytes(len(url)) + protowire.SizeTag(2) + protowire.SizeBytes(v)
	}
	b := make([]byte, 0, sizes[0])
	for k := range depth {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, url)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizes[k+1]))
	}
	m := &anypb.Any{}
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFingerprintNestedAnyCost: a request of Anys packed in one another a
// thousand deep (44 KB) is fingerprinted at a cost in proportion to its
// size. Each level re-encoded decoded a copy of the bytes inside it, and
// kept it until the levels below were done: 46 MB allocated for 44 KB, 711
// MB for 180 KB, so one request of a few MB (under gRPC's 4 MB default)
// took the server's memory, before anything was claimed. The same bytes
// still fingerprint the same, and a change at the bottom still counts.
func TestFingerprintNestedAnyCost(t *testing.T) {
	m := nestedAny(t, 1000)
	size := proto.Size(m)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fp, err := grpcx.DefaultFingerprint("/x.Payments/Charge", m)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte request: %d bytes allocated", size, alloc)
	if alloc > uint64(64*size) {
		t.Fatalf("fingerprint of a %d-byte request allocated %d bytes (%d×); want at most 64×", size, alloc, alloc/uint64(size))
	}
	if again, err := grpcx.DefaultFingerprint("/x.Payments/Charge", nestedAny(t, 1000)); err != nil || again != fp {
		t.Fatalf("the same request fingerprinted %s, then %s (%v)", fp, again, err)
	}
	if other, err := grpcx.DefaultFingerprint("/x.Payments/Charge", nestedAny(t, 1001)); err != nil || other == fp {
		t.Fatalf("one more level fingerprinted the same (%v)", err)
	}
}
