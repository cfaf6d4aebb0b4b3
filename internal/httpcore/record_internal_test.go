package httpcore

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"testing"
)

func TestResponseEncoding(t *testing.T) {
	cases := []storedResponse{
		{status: 201, header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}}, body: []byte(`{"id":1}`)},
		{status: 204},
		{status: 200, body: bytes.Repeat([]byte{0, 0xff, '\n'}, 1000)},
		{status: 201, notKept: notKeptTooLarge},
		{status: 200, notKept: notKeptHijacked},
		{status: 201, notKept: notKeptStreamed},
		{status: 200, notKept: notKeptCutShort},
		{status: 201, notKept: notKeptBypassed},
	}
	for _, want := range cases {
		b := encodeResponse(want)
		got, err := decodeResponse(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", want, err)
		}
		if got.status != want.status || got.notKept != want.notKept || !bytes.Equal(got.body, want.body) ||
			(len(want.header) > 0 || len(got.header) > 0) && !reflect.DeepEqual(got.header, want.header) {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
		if !bytes.Equal(encodeResponse(got), b) {
			t.Fatal("re-encoding differs")
		}
		// Every strict prefix is refused.
		for i := range len(b) {
			if _, err := decodeResponse(b[:i]); !errors.Is(err, errCorruptResponse) {
				t.Fatalf("prefix of %d/%d bytes: %v", i, len(b), err)
			}
		}
	}
	for _, garbage := range [][]byte{nil, {2, 0, 200, 1, 0, 0}, {1, 32, 200, 1, 0, 0}, {1, 0, 99, 0}, {1, 0, 0xc8, 0x01, 5, 0}, {1, 0, 0xc8, 0x01, 0x00, 0x00, 0x01}} {
		if _, err := decodeResponse(garbage); !errors.Is(err, errCorruptResponse) {
			t.Errorf("decode(%v): %v, want errCorruptResponse", garbage, err)
		}
	}
}

// FuzzDecodeResponse: decodeResponse never panics, and whatever it accepts
// encodes back to the same bytes (the format has one spelling per value,
// given sorted names). The seeds include values the SQL backstop holds:
// responses CommitResponse committed, read back from PostgreSQL (live
// when IDEMGUARD_POSTGRES_DSN is set, and saved in testdata/fuzz), and the
// plain results non-HTTP callers commit.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(storedResponse{status: 201, header: http.Header{"A": {"1", "2"}, "B": {"x"}}, body: []byte("hi")}))
	f.Add(encodeResponse(storedResponse{status: 500, notKept: notKeptTooLarge}))
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte("receipt-42")) // a plain result, as Backstop.Func stores
	f.Add([]byte{})
	for _, v := range backstopValues(f) {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			if !errors.Is(err, errCorruptResponse) {
				t.Fatalf("error %v does not wrap errCorruptResponse", err)
			}
			return
		}
		if r.status < 100 || r.status > 999 {
			t.Fatalf("status %d accepted", r.status)
		}
		again, err := decodeResponse(encodeResponse(r))
		if err != nil || again.status != r.status || !bytes.Equal(again.body, r.body) || len(again.header) != len(r.header) {
			t.Fatalf("re-encode of %+v: %+v, %v", r, again, err)
		}
	})
}

// A replay writes the stored fields straight from the record
// (responseView.setHeader); what it writes must be what decoding the
// record into a header and copying it over the response's gives, for
// records encodeResponse wrote (each name's values together) and for any
// other record decodeResponse accepts (names out of order, a name split).
// A field stored with a single empty value is replayed as removed (nil)
// either way.
func TestReplayHeaderAsDecoded(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 9))
	names := []string{"Content-Type", "Location", "X-A", "X-B", "A", "Zz", ReplayedHeader, "Outer"}
	values := []string{"", "a", "b", "application/json", "x, y"}
	var records [][]byte
	for range 2000 {
		h := http.Header{}
		for j := rnd.IntN(8); j > 0; j-- {
			k := names[rnd.IntN(len(names))]
			h[k] = append(h[k], values[rnd.IntN(len(values))])
		}
		records = append(records, encodeResponse(storedResponse{status: 201, header: h, body: []byte("body")}))
	}
	// Hand-made: B, A, B (B's values apart; names out of order) and a
	// record that sets Idempotent-Replayed itself.
	records = append(records,
		[]byte{1, 0, 0xc8, 0x01, 3, 1, 'B', 1, '1', 1, 'A', 1, '2', 1, 'B', 1, '3', 0},
		[]byte{1, 0, 0xc8, 0x01, 1, 19, 'I', 'd', 'e', 'm', 'p', 'o', 't', 'e', 'n', 't', '-', 'R', 'e', 'p', 'l', 'a', 'y', 'e', 'd', 1, 'x', 0})
	for _, rec := range records {
		sr, err := decodeResponse(rec)
		if err != nil {
			t.Fatal(err)
		}
		want := http.Header{"Outer": {"from outer middleware"}, "X-A": {"outer"}}
		for k, vs := range sr.header {
			if len(vs) == 1 && vs[0] == "" {
				vs = nil // stored as removed: replayed without the field
			}
			want[k] = vs
		}
		want.Set(ReplayedHeader, "true")
		v, err := parseResponse(rec)
		if err != nil {
			t.Fatal(err)
		}
		got := http.Header{"Outer": {"from outer middleware"}, "X-A": {"outer"}}
		v.setHeader(got)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("record %v: replay header\n%v\nwant\n%v", rec, got, want)
		}
		// Each field's values are its own: appending to one leaves the
		// others as they were.
		for k := range got {
			got[k] = append(got[k], "appended")
		}
		for k, vs := range got {
			if !slices.Equal(vs[:len(vs)-1], want[k]) {
				t.Fatalf("record %v: after appending to every field, %s is %q, want %q", rec, k, vs, want[k])
			}
		}
	}
}
