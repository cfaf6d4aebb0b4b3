package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/internal/parallel"
)

// BatchStore is a Store that claims many keys, and writes for many
// holders, in a round trip or two instead of one per key. Guard.DoBatch
// uses it when the Guard's store implements it, and the Store's own
// methods one key at a time otherwise, with the same answers.
//
// Every answer is the one the matching Store method gives for that key:
// ClaimBatch's out[i] and errs[i] are Claim's for reqs[i], WriteBatch's
// errs[i] is Complete's, Fail's, Release's or Extend's for ws[i]. Each
// key's change is atomic and a compare-and-set on its owner token; the
// batch is not atomic as a whole (a store that fails half-way answers the
// rest with errors wrapping ErrUnavailable), and a batch sent again with
// the same arguments gets the same answers. A batch names each key at
// most once. The package storetest holds the contract (Run's Batch cases).
type BatchStore interface {
	Store
	// ClaimBatch claims every request; out and errs have len(reqs)
	// entries.
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) (out []Outcome, errs []error)
	// WriteBatch makes every write; errs has len(ws) entries.
	WriteBatch(ctx context.Context, ws []Write) (errs []error)
}

// WriteKind names the Store method a Write stands for.
type WriteKind uint8

// The writes of WriteBatch.
const (
	WriteComplete WriteKind = iota + 1 // Store.Complete(Lease, Result, TTL)
	WriteFail                          // Store.Fail(Lease, Reason, TTL)
	WriteRelease                       // Store.Release(Lease)
	WriteExtend                        // Store.Extend(Lease, TTL): TTL is the lease's new length
)

var writeNames = [...]string{"", "complete", "fail", "release", "extend"}

func (k WriteKind) String() string {
	if int(k) < len(writeNames) && k != 0 {
		return writeNames[k]
	}
	return "unknown"
}

// Write is one holder's write in a WriteBatch: the arguments of the Store
// method its Kind names.
type Write struct {
	Kind   WriteKind
	Lease  Lease
	Result []byte        // WriteComplete: the result to store
	Reason string        // WriteFail: why the attempt failed
	TTL    time.Duration // WriteComplete, WriteFail: the retention; WriteExtend: the lease
}

// perKeyWorkers bounds the calls a perKey batch makes at once.
const perKeyWorkers = 16

// batchStoreOf returns s as a BatchStore: itself when it is one, else a
// BatchStore that makes s's calls one key at a time, up to perKeyWorkers
// at once.
func batchStoreOf(s Store) BatchStore {
	if bs, ok := s.(BatchStore); ok {
		return bs
	}
	return perKey{s}
}

// perKey is a BatchStore over a Store without batches of its own.
type perKey struct{ Store }

func (p perKey) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Outcome, []error) {
	out, errs := make([]Outcome, len(reqs)), make([]error, len(reqs))
	parallel.Each(len(reqs), perKeyWorkers, func(i int) { out[i], errs[i] = p.Claim(ctx, reqs[i]) })
	return out, errs
}

func (p perKey) WriteBatch(ctx context.Context, ws []Write) []error {
	errs := make([]error, len(ws))
	parallel.Each(len(ws), perKeyWorkers, func(i int) { errs[i] = write(ctx, p.Store, &ws[i]) })
	return errs
}

// write makes w through s's own method.
func write(ctx context.Context, s Store, w *Write) error {
	switch w.Kind {
	case WriteComplete:
		return s.Complete(ctx, w.Lease, w.Result, w.TTL)
	case WriteFail:
		return s.Fail(ctx, w.Lease, w.Reason, w.TTL)
	case WriteRelease:
		return s.Release(ctx, w.Lease)
	case WriteExtend:
		return s.Extend(ctx, w.Lease, w.TTL)
	}
	return fmt.Errorf("idemguard: unknown write kind %d", w.Kind)
}
