package core

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, c := range []storedCall{
		{typeName: "google.protobuf.ListValue", message: []byte{1, 2, 3},
			header:  MD{"x-a": {"1", "2"}, "x-b-bin": {"\x00\xff"}},
			trailer: MD{"x-t": {""}}},
		{typeName: "google.protobuf.Empty", message: []byte{}},
		{status: []byte{8, 5, 18, 1, 'x'}, header: MD{"x-h": {"v"}}},
		{typeName: "x.Big", notKept: notKeptTooLarge},
	} {
		b := encodeRecord(c)
		got, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if got.typeName != c.typeName || !bytes.Equal(got.message, c.message) || (got.message == nil) != (c.message == nil) ||
			!bytes.Equal(got.status, c.status) || got.notKept != c.notKept || !mdEqual(got.header, c.header) || !mdEqual(got.trailer, c.trailer) {
			t.Fatalf("round trip\n%+v\nwant\n%+v", got, c)
		}
		if !bytes.Equal(encodeRecord(got), b) {
			t.Fatalf("encoding is not stable")
		}
	}
	for _, bad := range [][]byte{nil, {2}, {recordVersion, 0x0a}, {recordVersion, 0x22, 2, 0x12, 0}, {recordVersion, 0x0a, 5, 'a'}} {
		if _, err := decodeRecord(bad); err == nil {
			t.Errorf("decodeRecord(%x) = nil error", bad)
		}
	}
}

func mdEqual(a, b MD) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if len(b[k]) != len(vs) {
			return false
		}
		for i := range vs {
			if b[k][i] != vs[i] {
				return false
			}
		}
	}
	return true
}

// A response type the program does not link is replayed as an Empty whose
// unknown fields are the stored bytes: it encodes to those bytes exactly.
func TestNewMessageUnknownType(t *testing.T) {
	orig, _ := structpb.NewList([]any{"a", 1.0})
	b, _ := proto.Marshal(orig)
	m := NewMessage("nowhere.Unlinked", b)
	if _, ok := m.(*emptypb.Empty); !ok {
		t.Fatalf("got %T", m)
	}
	if out, _ := proto.Marshal(m); !bytes.Equal(out, b) {
		t.Fatalf("re-encoded %x, want %x", out, b)
	}
	if m := NewMessage("google.protobuf.ListValue", b); !proto.Equal(m, orig) {
		t.Fatalf("linked type: %v", m)
	}
	if m := NewMessage("google.protobuf.ListValue", []byte{0xff}); m != nil {
		t.Fatalf("bad bytes: %v", m)
	}
}

// TestKeyDigestIsMetrics: the interceptor's log records name a key by
// metrics.KeyDigest, so they correlate with the guard's.
func TestKeyDigestIsMetrics(t *testing.T) {
	s := &Server{}
	for _, k := range []guard.Key{{Scope: "/a.B/C", ID: "k"}, {Scope: `"acct" /x.Y/Z`, ID: "0190f5c4-uuid"}} {
		if attrs := s.logKey(k); len(attrs) != 2 || attrs[1] != metrics.KeyDigest(k) {
			t.Fatalf("%v: %v vs %s", k, attrs, metrics.KeyDigest(k))
		}
	}
}
