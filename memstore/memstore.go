// Package memstore is a guard.Store held in the memory of one process: for
// services that run as a single process, and for unit tests that want a
// guard without a Redis.
//
// It keeps the guard.Store contract (guard/storetest) with the Redis
// store's answers (TestSameAsRedisStore compares the two call by call):
// compare-and-set on the owner token, every call safe to repeat (a retried
// Fail or Release still answers OK after another claim took the key over),
// lease recovery with fence+1 and attempt+1, MaxAttempts, Release,
// retention. Leases and retention are judged by Options.Now. A claimed key
// is kept until its lease ends (an extended lease's end) and for the
// claim's TTL after that, as the Redis store keeps it, so a holder that
// died is recovered even when the TTL is shorter than the lease; a
// completed or failed one for the TTL its Complete or Fail gave.
//
// What it does not give:
//
//   - Nothing across processes. Two processes, each with its own memstore,
//     do not see each other's keys: a duplicate delivered to the other
//     process runs the effect a second time. Several instances of a service
//     need a shared store (guard.NewRedisStore, pgstore.New).
//   - Nothing across restarts. Every record lives in this process's memory
//     and is lost when it exits: a key completed before a restart runs
//     again after it.
//
// The store starts no goroutine and needs no Close. Expired records are
// removed when a call finds them, and every call also removes a few of the
// records that expired longest ago, so memory follows the live records as
// long as the store is used. A store that is no longer called keeps its
// records until it is dropped.
package memstore

import (
	"bytes"
	"container/heap"
	"container/list"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// ErrFull is returned (wrapped, with the store's counts) by a Claim that
// would add a key to a store with no room left under Options.MaxRecords or
// Options.MaxBytes. It wraps guard.ErrUnavailable: nothing was
// claimed and no effect may run, as when a Redis is out of memory; retry
// later, when records have expired. The store never makes room by
// forgetting a pending, failed or completed key.
var ErrFull = fmt.Errorf("%w: memstore is full", guard.ErrUnavailable)

// Options configure a Store. The zero value is ready to use: the real
// clock and no bound on the records held.
type Options struct {
	// Now is the clock leases and retention are judged by. Default
	// time.Now. Tests inject a clock they move themselves, to make leases
	// run out and records expire without sleeping. The store calls it
	// with its lock held; a clock that other goroutines move must be safe
	// for concurrent use.
	Now func() time.Time

	// MaxRecords bounds the keys the store holds: pending, failed and
	// completed records, and the released first attempts it remembers for
	// a minute (see Store.Release). A Claim that would add a key beyond it
	// first removes the expired records and the oldest released attempts,
	// and if that is not enough returns an error wrapping ErrFull. Claims
	// on keys already held, and every Complete, Fail, Release and Extend,
	// are never refused. Zero or less means no bound.
	MaxRecords int

	// MaxBytes bounds the memory of the records held, as the store
	// estimates it: RecordOverhead per record plus the bytes of its scope,
	// ID, fingerprint, tokens, result, failure reason and steps. A Claim
	// whose new record would take the estimate past MaxBytes makes room or
	// is refused as for MaxRecords. A Complete, Fail or SaveStep is never
	// refused for the size of its result, reason or step (the effect has
	// already happened), so the estimate may exceed MaxBytes by the
	// results, reasons and steps of records claimed before it was reached.
	// Zero or less means no bound.
	MaxBytes int64
}

// RecordOverhead is what Stats.Bytes and Options.MaxBytes count for one
// record besides the bytes of its strings and result: the record itself,
// its map entry and its place in the expiry queue (measured on amd64 by
// TestBytesEstimate).
const RecordOverhead = 224

// releaseMemory is how long a released first attempt's token is
// remembered, so that a retry of that Release answers OK even after
// another claim took the key (as the Redis store's release.lua keeps it).
const releaseMemory = time.Minute

// sweepBatch is how many expired records every call removes at most,
// besides the one it may find itself. Each record is added by one call,
// so removing up to 16 per call keeps up with any rate of expiry.
const sweepBatch = 16

// Store is a guard.Store in process memory. It is safe for concurrent use;
// every call is atomic (one mutex guards all records). The zero value is
// an empty store, as New(Options{}) returns. See the package
// documentation for what it does not guarantee: nothing across processes,
// nothing across a restart.
type Store struct {
	now        func() time.Time // nil: time.Now (the zero Store)
	maxRecords int
	maxBytes   int64

	mu      sync.Mutex
	records map[guard.Key]*entry
	expiry  expiryQueue // every entry, soonest expiry first
	tombs   list.List   // released first attempts, oldest first
	bytes   int64       // sum of entry sizes
	peak    int         // the most records held since records was made (shrink)
}

var (
	_ guard.Store     = (*Store)(nil)
	_ guard.StepStore = (*Store)(nil)
)

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{
		now:        opts.Now,
		maxRecords: max(opts.MaxRecords, 0),
		maxBytes:   max(opts.MaxBytes, 0),
		records:    make(map[guard.Key]*entry),
	}
}

// released is the state of an entry that only remembers a released first
// attempt: the key reads as absent.
const released guard.State = 0

// entry is one key's record.
type entry struct {
	key        guard.Key
	state      guard.State // released: a remembered release, absent to callers
	fp         string
	token      string // the holder; for a released entry, the releaser
	ptok       string // the holder that ended its claim by Fail or Release before the current one took over
	fence      int64
	attempt    int
	recovered  bool
	result     []byte // non-nil once completed
	lastErr    string
	steps      []guard.StepResult // recorded steps (see SaveStep); dropped on completion
	leaseUntil time.Time          // pending: when the holder's lease runs out
	ret        time.Duration      // pending: the claim's TTL, which the record outlives its lease by
	expires    time.Time          // when the record is removed

	index int           // in Store.expiry
	tomb  *list.Element // in Store.tombs, for a released entry
	size  int64         // as counted in Store.bytes
}

func (e *entry) estimate() int64 {
	return RecordOverhead + int64(len(e.key.Scope)+len(e.key.ID)+len(e.fp)+len(e.token)+len(e.ptok)+len(e.result)+len(e.lastErr)) +
		stepsSize(e.steps)
}

// Claim implements guard.Store, following the Redis store's claim.lua: a
// completed key replays (or is a mismatch); a new key is taken with fence 1;
// the same token claiming a pending key again gets the same answer and
// changes nothing; a live holder's key is in progress; a failed key, or a pending
// one whose lease ran out, is taken over with fence+1 and attempt+1 unless
// MaxAttempts are used up.
//
// A request with an invalid key, an empty token, a lease or TTL that is not
// positive, or negative MaxAttempts is refused with an error and changes
// nothing; an invalid key's error wraps guard.ErrInvalidKey. A cancelled
// ctx returns ctx.Err(). A new key refused for room returns an error
// wrapping ErrFull.
func (s *Store) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return guard.Outcome{}, err
	}
	if err := checkClaim(req); err != nil {
		return guard.Outcome{}, err
	}
	s.mu.Lock()
	out, err := s.claim(req)
	s.mu.Unlock()
	if out.Status == guard.Replay {
		out.Result = bytes.Clone(out.Result) // stored results are never changed in place
	}
	out.Steps = cloneSteps(out.Steps)
	return out, err
}

func checkClaim(req guard.ClaimRequest) error {
	if err := req.Key.Validate(); err != nil {
		return fmt.Errorf("memstore: claim: %w", err)
	}
	switch {
	case req.Token == "":
		return fmt.Errorf("memstore: claim of %s without an owner token", req.Key)
	case req.Lease <= 0:
		return fmt.Errorf("memstore: claim of %s: lease %s is not positive", req.Key, req.Lease)
	case req.TTL <= 0:
		return fmt.Errorf("memstore: claim of %s: ttl %s is not positive", req.Key, req.TTL)
	case req.MaxAttempts < 0:
		return fmt.Errorf("memstore: claim of %s: max attempts %d is negative", req.Key, req.MaxAttempts)
	}
	return nil
}

func (s *Store) claim(req guard.ClaimRequest) (guard.Outcome, error) {
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.lookup(req.Key, now)

	// A different payload under the same key learns nothing else about it.
	if e != nil && e.state == guard.StateCompleted {
		if e.fp != req.Fingerprint {
			return guard.Outcome{Status: guard.Mismatch}, nil
		}
		return guard.Outcome{Status: guard.Replay, Result: e.result}, nil
	}

	leaseUntil := now.Add(req.Lease)
	// Kept for the TTL after the lease ends, not from the claim: a TTL
	// shorter than the lease must not forget an abandoned claim before
	// the next one can recover it (its fence, attempts and steps).
	expires := leaseUntil.Add(req.TTL)
	if e == nil || e.state == released {
		return s.claimNew(req, e, now, leaseUntil, expires)
	}
	if e.fp != req.Fingerprint {
		return guard.Outcome{Status: guard.Mismatch}, nil
	}

	switch e.state {
	case guard.StatePending:
		if e.token == req.Token {
			// The same claim sent again: the same answer. The lease is not
			// renewed, so a repeat can neither shorten an extended lease
			// nor outlast the deadline its holder counts from the first.
			return acquired(e), nil
		}
		if now.Before(e.leaseUntil) {
			return guard.Outcome{Status: guard.InProgress, LeaseLeft: e.leaseUntil.Sub(now)}, nil
		}
	case guard.StateFailed:
		if e.token == req.Token {
			// A copy of this claim that comes after its holder failed it
			// (RedisStore: a claim re-sent after a lost reply): it takes
			// nothing, as RedisStore answers.
			return guard.Outcome{Status: guard.InProgress}, nil
		}
	default:
		return guard.Outcome{}, fmt.Errorf("%w: memstore: %s has state %d", guard.ErrCorrupt, req.Key, e.state)
	}

	// Failed, or pending with its lease gone (the holder died): take it over.
	recovering := e.state == guard.StatePending
	if req.MaxAttempts > 0 && e.attempt >= req.MaxAttempts {
		if recovering {
			e.state, e.lastErr, e.leaseUntil = guard.StateFailed, "lease expired", time.Time{}
			s.resize(e)
		}
		return guard.Outcome{Status: guard.Exhausted, Attempts: e.attempt, LastError: e.lastErr}, nil
	}
	// ptok: the holder that ended its claim by Fail or Release, so that a
	// retry of that call still answers OK after this claim took over.
	e.ptok = ""
	if !recovering {
		e.ptok = e.token
	}
	e.state, e.token = guard.StatePending, strings.Clone(req.Token)
	e.fence++
	e.attempt++
	e.recovered = recovering
	e.leaseUntil, e.ret = leaseUntil, req.TTL
	s.resize(e)
	s.expireAt(e, expires)
	return acquired(e), nil
}

// claimNew takes a key that is absent, or only remembers a release (tomb).
func (s *Store) claimNew(req guard.ClaimRequest, tomb *entry, now, leaseUntil, expires time.Time) (guard.Outcome, error) {
	ptok, fence := "", int64(1)
	if tomb != nil {
		// A first attempt released just before: remember its token, so
		// that a retry of that Release still answers OK, and give the
		// next fence (the released holder ran).
		ptok, fence = tomb.token, tomb.fence+1
		s.remove(tomb)
	}
	key := guard.Key{Scope: strings.Clone(req.Key.Scope), ID: strings.Clone(req.Key.ID)}
	e := &entry{
		key:        key,
		state:      guard.StatePending,
		fp:         strings.Clone(req.Fingerprint),
		token:      strings.Clone(req.Token),
		ptok:       ptok,
		fence:      fence,
		attempt:    1,
		leaseUntil: leaseUntil,
		ret:        req.TTL,
		expires:    expires,
	}
	if err := s.admit(e, now); err != nil {
		return guard.Outcome{}, err
	}
	e.size = e.estimate()
	s.bytes += e.size
	if s.records == nil { // the zero Store
		s.records = make(map[guard.Key]*entry)
	}
	s.records[key] = e
	s.peak = max(s.peak, len(s.records))
	heap.Push(&s.expiry, e)
	return acquired(e), nil
}

// admit makes room for e under the bounds, or says why it cannot: it
// removes expired records, then the oldest remembered releases, and never
// a live pending, failed or completed record.
func (s *Store) admit(e *entry, now time.Time) error {
	size := e.estimate()
	full := func() bool {
		return (s.maxRecords > 0 && len(s.records) >= s.maxRecords) ||
			(s.maxBytes > 0 && s.bytes+size > s.maxBytes)
	}
	if !full() {
		return nil
	}
	s.sweep(now, -1)
	for full() && s.tombs.Len() > 0 {
		s.remove(s.tombs.Front().Value.(*entry))
	}
	if !full() {
		return nil
	}
	return fmt.Errorf("%w: claim of %s refused: %d records, %d bytes held (limits: %s records, %s bytes; this record %d bytes)",
		ErrFull, e.key, len(s.records), s.bytes, limit(int64(s.maxRecords)), limit(s.maxBytes), size)
}

func limit(n int64) string {
	if n <= 0 {
		return "no limit"
	}
	return fmt.Sprint(n)
}

func acquired(e *entry) guard.Outcome {
	return guard.Outcome{Status: guard.Acquired, Steps: e.steps, Lease: guard.Lease{
		Key: e.key, Token: e.token, Fence: e.fence, Attempt: e.attempt, Recovered: e.recovered,
	}}
}

// Complete implements guard.Store: the holder's pending record becomes
// completed with a copy of result (a caller that changes its slice later
// changes nothing stored) and is kept for ttl. Completing again with the
// same lease answers nil and keeps the first result. A caller that does not
// hold the key gets guard.ErrLeaseLost and changes nothing. A ttl that is
// not positive is refused with an error.
func (s *Store) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("memstore: complete %s: ttl %s is not positive", lease.Key, ttl)
	}
	stored := append([]byte{}, result...) // non-nil: an empty result is a result
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.held(lease, now)
	switch {
	case e == nil || e.token != lease.Token:
		return guard.ErrLeaseLost
	case e.state == guard.StateCompleted:
		return nil // the same complete again
	case e.state != guard.StatePending:
		return guard.ErrLeaseLost
	}
	e.state, e.result, e.leaseUntil, e.steps = guard.StateCompleted, stored, time.Time{}, nil
	s.resize(e)
	s.expireAt(e, now.Add(ttl))
	return nil
}

// Fail implements guard.Store: the holder's pending record becomes failed
// with reason, keeping its attempts, and is kept for ttl; the key may be
// claimed again until MaxAttempts. Failing again with the same lease
// answers nil, even after another claim took the failed key over. A caller
// that does not hold the key gets guard.ErrLeaseLost and changes nothing.
// A ttl that is not positive is refused with an error.
func (s *Store) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("memstore: fail %s: ttl %s is not positive", lease.Key, ttl)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.held(lease, now)
	switch {
	case e == nil:
		return guard.ErrLeaseLost
	case e.token != lease.Token:
		if e.ptok != "" && e.ptok == lease.Token {
			return nil // a retry of this fail, after another claim took the key over
		}
		return guard.ErrLeaseLost
	case e.state == guard.StateFailed:
		return nil // the same fail again
	case e.state != guard.StatePending:
		return guard.ErrLeaseLost
	}
	e.state, e.lastErr, e.leaseUntil = guard.StateFailed, strings.Clone(reason), time.Time{}
	s.resize(e)
	s.expireAt(e, now.Add(ttl))
	return nil
}

// Release implements guard.Store: it undoes the holder's claim as if it had
// never been made. A first attempt's record is removed (its token is
// remembered for a minute, so that a retry of this Release answers nil even
// after another claim re-created the key); a later attempt's record returns
// to failed with the attempt uncounted and its fence kept, so fences only
// grow. A claim that recorded steps (SaveStep) cannot be undone, their
// effects having happened: its record returns to failed keeping them, the
// attempt uncounted unless it was the first (storetest's
// Steps/ReleaseKeepsThem). Releasing a key that is gone, or releasing again, answers nil. A
// caller that does not hold the key gets guard.ErrLeaseLost and changes
// nothing; so does the holder of a completed key.
func (s *Store) Release(ctx context.Context, lease guard.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.held(lease, now)
	switch {
	case e == nil:
		return nil // gone already
	case e.token != lease.Token:
		if e.ptok != "" && e.ptok == lease.Token {
			return nil // a retry of this release, after another claim took the key over
		}
		return guard.ErrLeaseLost
	case e.state == guard.StateFailed:
		return nil // released (or failed) before
	case e.state != guard.StatePending:
		return guard.ErrLeaseLost
	}
	if e.attempt <= 1 && len(e.steps) == 0 {
		// Absent from now on, but remember who released it.
		*e = entry{key: e.key, state: released, token: e.token, fence: e.fence, index: e.index, size: e.size}
		e.tomb = s.tombs.PushBack(e)
		s.resize(e)
		s.expireAt(e, now.Add(releaseMemory))
		return nil
	}
	// A later attempt, or one whose steps happened: failed, with the
	// attempt uncounted unless it was the first.
	e.state, e.leaseUntil = guard.StateFailed, time.Time{}
	e.attempt = max(e.attempt-1, 1)
	return nil
}

// Extend implements guard.Store: the holder's lease runs for d from now,
// and the record is kept for the claim's TTL after it. A lease that ran out still
// belongs to its holder until another claim takes the key over. A caller
// that does not hold a pending key gets guard.ErrLeaseLost. A d that is not
// positive is refused with an error.
func (s *Store) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("memstore: extend %s: lease %s is not positive", lease.Key, d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.held(lease, now)
	if e == nil || e.state != guard.StatePending || e.token != lease.Token {
		return guard.ErrLeaseLost
	}
	// The record outlives the new lease by the claim's TTL, as extend.lua
	// keeps it: a shorter lease shortens it too.
	e.leaseUntil = now.Add(d)
	s.expireAt(e, e.leaseUntil.Add(e.ret))
	return nil
}

// Get implements guard.Store: a copy of the key's record, or
// guard.ErrNotFound. LeaseLeft and TTL are measured on Options.Now.
func (s *Store) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	if err := ctx.Err(); err != nil {
		return guard.Record{}, err
	}
	s.mu.Lock()
	now := s.clock()
	s.sweep(now, sweepBatch)
	e := s.lookup(key, now)
	if e == nil || e.state == released {
		s.mu.Unlock()
		return guard.Record{}, guard.ErrNotFound
	}
	rec := guard.Record{
		Key:         e.key,
		State:       e.state,
		Fingerprint: e.fp,
		Token:       e.token,
		Fence:       e.fence,
		Attempt:     e.attempt,
		Recovered:   e.recovered,
		Result:      e.result,
		LastError:   e.lastErr,
		TTL:         e.expires.Sub(now),
		Steps:       e.steps,
	}
	if e.state == guard.StatePending && now.Before(e.leaseUntil) {
		rec.LeaseLeft = e.leaseUntil.Sub(now)
	}
	s.mu.Unlock()
	rec.Result = bytes.Clone(rec.Result)
	rec.Steps = cloneSteps(rec.Steps)
	return rec, nil
}

// Stats describes what a Store holds.
type Stats struct {
	// Records is the number of pending, failed and completed records held,
	// including expired ones not yet removed.
	Records int
	// Released is the number of released first attempts remembered (see
	// Store.Release).
	Released int
	// Bytes is the estimated memory of both, as Options.MaxBytes counts it.
	Bytes int64
}

// Stats returns what the store holds now. It removes nothing.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Records: len(s.records) - s.tombs.Len(), Released: s.tombs.Len(), Bytes: s.bytes}
}

// clock is Options.Now's time, or the real clock's in a zero Store.
func (s *Store) clock() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// lookup returns key's entry, removing it if it has expired.
func (s *Store) lookup(key guard.Key, now time.Time) *entry {
	e := s.records[key]
	if e != nil && !now.Before(e.expires) {
		s.remove(e)
		return nil
	}
	return e
}

// held returns the entry a write with lease acts on: nil when the key is
// absent or only remembers a release.
func (s *Store) held(lease guard.Lease, now time.Time) *entry {
	e := s.lookup(lease.Key, now)
	if e == nil || e.state == released {
		return nil
	}
	return e
}

// sweep removes up to n expired entries (all of them if n < 0), longest
// expired first.
func (s *Store) sweep(now time.Time, n int) {
	for ; n != 0 && len(s.expiry) > 0 && !now.Before(s.expiry[0].expires); n-- {
		s.remove(s.expiry[0])
	}
}

func (s *Store) remove(e *entry) {
	delete(s.records, e.key)
	heap.Remove(&s.expiry, e.index)
	if e.tomb != nil {
		s.tombs.Remove(e.tomb)
		e.tomb = nil
	}
	s.bytes -= e.size
	if s.peak > shrinkFloor && len(s.records) < s.peak/4 {
		s.shrink()
	}
}

// shrinkFloor is the number of records below which a store never
// shrinks: a small map's storage is not worth copying.
const shrinkFloor = 1024

// shrink copies the records into storage sized for them. A Go map never
// gives back the storage of deleted entries (nor a slice its capacity),
// so after a burst of keys has expired the store would hold the burst's
// peak for good; shrinking once the records fall below a quarter of it
// keeps memory following the live records, at a cost of one copy per
// record removed since (amortised: each copy follows three times as
// many removals).
func (s *Store) shrink() {
	records := make(map[guard.Key]*entry, len(s.records))
	for k, e := range s.records {
		records[k] = e
	}
	s.records, s.expiry, s.peak = records, slices.Clone(s.expiry), len(records)
}

// resize counts e's size again after a change.
func (s *Store) resize(e *entry) {
	n := e.estimate()
	s.bytes += n - e.size
	e.size = n
}

func (s *Store) expireAt(e *entry, t time.Time) {
	e.expires = t
	heap.Fix(&s.expiry, e.index)
}

// expiryQueue is a min-heap of entries by expiry (container/heap).
type expiryQueue []*entry

func (q expiryQueue) Len() int           { return len(q) }
func (q expiryQueue) Less(i, j int) bool { return q[i].expires.Before(q[j].expires) }
func (q expiryQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *expiryQueue) Push(x any) {
	e := x.(*entry)
	e.index = len(*q)
	*q = append(*q, e)
}

func (q *expiryQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	e.index = -1
	return e
}
