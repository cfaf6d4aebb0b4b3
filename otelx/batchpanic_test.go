package otelx_test

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/otelx"
)

// panickyBatch is a BatchStore whose batch calls panic (a driver bug, a
// nil map in a wrapper of one's own): the caller's server recovers it.
type panickyBatch struct{ guard.Store }

func (panickyBatch) ClaimBatch(context.Context, []guard.ClaimRequest) ([]guard.Outcome, []error) {
	panic("store bug")
}

func (panickyBatch) WriteBatch(context.Context, []guard.Write) []error { panic("store bug") }

// TestBatchSpansEndedOnPanic: a single Claim's span is ended when
// the store panics (defer span.End()); a batch's spans, one per key, must
// be too, or they are never exported and stay live in every span
// processor that tracks open spans.
func TestBatchSpansEndedOnPanic(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	bs := tt.tr.Store(panickyBatch{memstore.New(memstore.Options{})}).(guard.BatchStore)
	k1, k2 := guard.Key{Scope: "s", ID: "a-key"}, guard.Key{Scope: "s", ID: "b-key"}
	call := func(f func()) {
		defer func() { _ = recover() }()
		f()
	}
	call(func() {
		bs.ClaimBatch(context.Background(), []guard.ClaimRequest{{Key: k1, Fingerprint: "fp"}, {Key: k2, Fingerprint: "fp"}})
	})
	call(func() {
		bs.WriteBatch(context.Background(), []guard.Write{{Kind: guard.WriteComplete, Lease: guard.Lease{Key: k1, Token: "t"}}})
	})
	if started, ended := len(tt.rec.Started()), len(tt.rec.Ended()); started != ended {
		t.Errorf("%d spans started, %d ended: a batch's spans are left open when the store panics", started, ended)
	}
}
