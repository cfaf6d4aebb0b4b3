package grpcx_test

import (
	"bytes"
	"runtime"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

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

// deepValue is a google.protobuf.Struct whose field "v" holds a ListValue
// holding a Value holding a ListValue..., depth Values deep, with 64 KB of
// string at the bottom. Each Value also carries field 1 (null_value) with
// the wrong wire type, fixed32, which the decoder keeps as an unknown
// field, so Go encodes it after the list (6): out of number order at every
// level.
func deepValue(t testing.TB, depth int) *structpb.Struct {
	t.Helper()
	bottom := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), bytes.Repeat([]byte("x"), 64<<10)) // Value.string_value
	// values[k]: the size of the Value k levels down; written outside in,
	// so making it costs its size, not the square of it.
	values := make([]int, depth+1)
	values[depth] = len(bottom)
	list := func(k int) int { return protowire.SizeTag(1) + protowire.SizeBytes(values[k+1]) } // ListValue.values
	for k := depth - 1; k >= 0; k-- {
		values[k] = protowire.SizeTag(1) + 4 + protowire.SizeTag(6) + protowire.SizeBytes(list(k))
	}
	const name = "v"
	entry := protowire.SizeTag(1) + protowire.SizeBytes(len(name)) + protowire.SizeTag(2) + protowire.SizeBytes(values[0])
	b := protowire.AppendTag(nil, 1, protowire.BytesType) // Struct.fields, one map entry
	b = protowire.AppendVarint(b, uint64(entry))
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), name)
	b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(values[0]))
	for k := range depth {
		b = protowire.AppendFixed32(protowire.AppendTag(b, 1, protowire.Fixed32Type), 7) // Value.null_value, wrong wire type
		b = protowire.AppendVarint(protowire.AppendTag(b, 6, protowire.BytesType), uint64(list(k)))
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.BytesType), uint64(values[k+1]))
	}
	b = append(b, bottom...)
	m := &structpb.Struct{}
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFingerprintDepthCost: requests built to make re-encoding costly are
// fingerprinted at a cost in proportion to their size (at most 64 bytes
// allocated per byte), the same request still fingerprints the same, and
// one more level at the bottom still counts.
//
//   - Anys packed in one another a thousand deep (44 KB): each level
//     re-encoded decoded a copy of the bytes inside it, and kept it until
//     the levels below were done: 46 MB allocated for 44 KB, 711 MB for
//     180 KB, so one request of a few MB (under gRPC's 4 MB default) took
//     the server's memory, before anything was claimed.
//   - A google.protobuf.Struct nested 2000 Values deep, out of number
//     order at each level (a field sent with another wire type is kept as
//     unknown and encoded last): putting each level in number order copied
//     that level whole: 146 MB for a 77 KB request; at the decoder's
//     10,000 levels and gRPC's 4 MB, some 20 GB copied for one request.
func TestFingerprintDepthCost(t *testing.T) {
	cases := []struct {
		name  string
		depth int
		make  func(testing.TB, int) proto.Message
	}{
		{"nested Any", 1000, func(t testing.TB, d int) proto.Message { return nestedAny(t, d) }},
		{"deep Value out of order", 2000, func(t testing.TB, d int) proto.Message { return deepValue(t, d) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.make(t, tc.depth)
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
			if again, err := grpcx.DefaultFingerprint("/x.Payments/Charge", tc.make(t, tc.depth)); err != nil || again != fp {
				t.Fatalf("the same request fingerprinted %s, then %s (%v)", fp, again, err)
			}
			if other, err := grpcx.DefaultFingerprint("/x.Payments/Charge", tc.make(t, tc.depth+1)); err != nil || other == fp {
				t.Fatalf("one more level fingerprinted the same (%v)", err)
			}
		})
	}
}
