package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
)

// Store is a guard.Store on PostgreSQL, for deployments without Redis and
// as a fallback. A claim is a conditional INSERT … ON CONFLICT, or a
// row-locked read and UPDATE; complete, fail, release and extend are
// compare-and-set UPDATEs on the owner token. Leases and retention are
// timestamps (leased_until, expires_at) compared with the database's clock,
// so callers' clocks never matter. A row whose expires_at has passed is
// treated as absent (its fence still grows on the next claim, until Purge
// deletes it). Its semantics are those of the Redis scripts, and it passes
// the same contract suite (guard/storetest).
//
// The Store writes the same table as package backstop: a
// backstop.Backstop.Commit made in the business transaction of a key held
// through this Store completes the key in that transaction.
//
// A Store also holds the helpers that share its tables: Purge,
// MarkConsumed and Consume, InsertOrRetry and the delivery updates. It is
// safe for concurrent use.
type Store struct {
	db   *sql.DB
	opts Options
	t    pgsql.Tables
	q    storeSQL
}

var (
	_ guard.Store     = (*Store)(nil)
	_ guard.StepStore = (*Store)(nil)
)

// New returns a Store on db, in the tables opts names (create them with
// Migrate). It returns an error for a nil db and for options that make no
// usable names. Calls are bounded by their context, except a new
// connection's wait for the server's first answer, which lib/pq bounds
// only by the DSN's connect_timeout: set one (a few seconds) when the
// Store backs a fallback during an outage.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgstore.New: nil *sql.DB")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	t := newTables(opts)
	return &Store{db: db, opts: opts, t: t, q: newStoreSQL(t)}, nil
}

// Options returns the store's options with defaults filled in.
func (s *Store) Options() Options { return s.opts }

// DB returns the database the store writes to.
func (s *Store) DB() *sql.DB { return s.db }

// storeSQL is the text of every statement the Store runs.
type storeSQL struct {
	claimNew, selectForUpdate, resetExpired, reclaim, exhaust, retake   string
	complete, fail, checkDone, releaseFirst, releaseLater, releaseCheck string
	extend, get                                                         string
	saveStep, readSteps                                                 string // store_steps.go
}

// claimColumns is what a claim reads of a record (see claimRow.dest).
var claimColumns = `fingerprint, status, token, fence, attempt, recovered, result, last_error,
	expires_at <= ` + clockNow + `, COALESCE(leased_until > ` + clockNow + `, false),
	COALESCE(` + untilUS("leased_until") + `, 0), steps`

func newStoreSQL(t pgsql.Tables) storeSQL {
	k := t.Keys
	live := `expires_at > ` + clockNow
	// The key has a live step row (backstop.Backstop.CommitStep).
	stepRows := `EXISTS (SELECT 1 FROM ` + t.Steps + ` AS s WHERE s.scope = $1 AND s.id = $2 AND s.expires_at > ` + clockNow + `)`
	return storeSQL{
		// $1 scope, $2 id, $3 fingerprint, $4 token, $5 lease µs, $6 keep µs
		claimNew: `WITH ins AS (INSERT INTO ` + k + ` ` + keysColumns + `
			VALUES ($1, $2, $3, 'pending', $4, 1, 1, false, NULL, '', ` + clockNow + ` + ` + dur("$5") + `, ` + clockNow + `, ` + clockNow + ` + ` + dur("$6") + `)
			ON CONFLICT (scope, id) DO NOTHING
			RETURNING 1)
			SELECT (SELECT count(*) FROM ins), ` + claimColumns + `
			FROM (SELECT 1) AS one LEFT JOIN ` + k + ` ON scope = $1 AND id = $2`,
		selectForUpdate: `SELECT ` + claimColumns + ` FROM ` + k + ` WHERE scope = $1 AND id = $2 FOR UPDATE`,
		// $1 scope, $2 id, $3 fingerprint, $4 token, $5 lease µs, $6 keep µs
		// ptok: a released first attempt's row (pending without a lease;
		// releaseFirst) names its releaser, as the Redis store's released
		// marker does, so that a retry of that release still answers OK.
		//
		// The key starts afresh, without the steps backstop.Backstop.Step
		// committed before it expired: they were the forgotten key's.
		resetExpired: `WITH forgotten AS (DELETE FROM ` + t.Steps + ` AS s USING ` + k + ` AS f
				WHERE s.scope = $1 AND s.id = $2 AND f.scope = $1 AND f.id = $2 AND s.created_at <= f.expires_at)
			UPDATE ` + k + ` SET fingerprint = $3, status = 'pending', token = $4, fence = fence + 1, attempt = 1,
				ptok = CASE WHEN status = 'pending' AND leased_until IS NULL THEN token ELSE '' END,
				recovered = false, result = NULL, last_error = '', steps = NULL, step_count = 0,
				leased_until = ` + clockNow + ` + ` + dur("$5") + `,
				created_at = ` + clockNow + `, expires_at = ` + clockNow + ` + ` + dur("$6") + `
			WHERE scope = $1 AND id = $2`,
		// The row is kept for the TTL after its lease ends (claimNew and
		// retake write expires_at = lease's end + TTL): renewing or
		// extending the lease moves its end by as much. A renewal never
		// shortens a lease its holder extended.
		reclaim: `UPDATE ` + k + ` SET leased_until = GREATEST(leased_until, ` + clockNow + ` + ` + dur("$3") + `),
				expires_at = GREATEST(expires_at, ` + clockNow + ` + ` + dur("$3") + ` + ` + pgsql.Span("leased_until", "expires_at") + `)
			WHERE scope = $1 AND id = $2`,
		exhaust: `UPDATE ` + k + ` SET status = 'failed', last_error = $3, leased_until = NULL WHERE scope = $1 AND id = $2`,
		// $1 scope, $2 id, $3 token, $4 recovered, $5 lease µs, $6 keep µs.
		// ptok: the holder that ended its claim by a failure or a release
		// (not one whose lease ran out), so that a retry of that call still
		// answers OK after this claim took the key over.
		retake: `UPDATE ` + k + ` SET status = 'pending', token = $3, fence = fence + 1, attempt = attempt + 1,
				ptok = CASE WHEN status = 'failed' THEN token ELSE '' END,
				recovered = $4, leased_until = ` + clockNow + ` + ` + dur("$5") + `, expires_at = ` + clockNow + ` + ` + dur("$6") + `
			WHERE scope = $1 AND id = $2`,
		// $1 scope, $2 id, $3 token, $4 result, $5 ttl µs
		complete: `UPDATE ` + k + ` SET status = 'completed', result = $4, leased_until = NULL, steps = NULL, step_count = 0,
				expires_at = ` + clockNow + ` + ` + dur("$5") + `
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND ` + live,
		// $1 scope, $2 id, $3 token, $4 reason, $5 ttl µs
		fail: `UPDATE ` + k + ` SET status = 'failed', last_error = $4, leased_until = NULL,
				expires_at = ` + clockNow + ` + ` + dur("$5") + `
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND ` + live,
		// The record's state and whether the caller holds it, when it holds
		// it or held it before the current holder (ptok).
		checkDone: `SELECT status, token = $3 FROM ` + k + ` WHERE scope = $1 AND id = $2 AND (token = $3 OR ptok = $3) AND ` + live,
		// A released first attempt reads as absent: its row is expired,
		// not deleted, so its fence still grows on the next claim (a first
		// attempt after retention passed has a fence above 1; deleting
		// the row would start the next one at 1 again). Its expiry is set
		// a second back so that a claim whose statement started just
		// before this one, and waited for the row, finds it expired too.
		// A claim whose steps happened is not undone: it returns to
		// failed with them, its attempt uncounted unless it was the first.
		// So is one with a step backstop.Backstop.CommitStep committed
		// (stepRows) whose result the row never got (the write failed):
		// its effect happened, and the row keeps refusing other payloads.
		releaseFirst: `UPDATE ` + k + ` SET leased_until = NULL, expires_at = ` + clockNow + ` - interval '1 second'
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND attempt <= 1 AND step_count = 0
				AND NOT ` + stepRows + ` AND ` + live,
		releaseLater: `UPDATE ` + k + ` SET status = 'failed', attempt = GREATEST(attempt - 1, 1), leased_until = NULL
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND (attempt > 1 OR step_count > 0 OR ` + stepRows + `) AND ` + live,
		releaseCheck: `SELECT status, token, ptok FROM ` + k + ` WHERE scope = $1 AND id = $2 AND ` + live,
		// $1 scope, $2 id, $3 token, $4 lease µs. The row is kept for the
		// claim's TTL after the new lease's end, which may come before
		// the old one's, as Redis's extend.lua keeps it.
		extend: `UPDATE ` + k + ` SET leased_until = ` + clockNow + ` + ` + dur("$4") + `,
				expires_at = ` + clockNow + ` + ` + dur("$4") + ` + ` + pgsql.Span("leased_until", "expires_at") + `
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND ` + live,
		get: `SELECT fingerprint, status, token, fence, attempt, recovered, result, last_error,
				COALESCE(` + untilUS("leased_until") + `, 0), ` + untilUS("expires_at") + `, steps
			FROM ` + k + ` WHERE scope = $1 AND id = $2 AND ` + live,
		saveStep:  fmt.Sprintf(saveStepSQL, k),
		readSteps: fmt.Sprintf(readStepsSQL, k),
	}
}

func checkClaim(req guard.ClaimRequest) error {
	if err := req.Key.Validate(); err != nil {
		return err
	}
	switch {
	case req.Token == "":
		return errors.New("pgstore: claim without an owner token")
	case req.Lease <= 0:
		return fmt.Errorf("pgstore: lease %s is not positive", req.Lease)
	case req.TTL <= 0:
		return fmt.Errorf("pgstore: ttl %s is not positive", req.TTL)
	case req.MaxAttempts < 0:
		return fmt.Errorf("pgstore: max attempts %d is negative", req.MaxAttempts)
	}
	return nil
}

// Claim implements guard.Store. One statement inserts a new key or, when
// the key exists, reads its record without locking it: taking a new key, a
// replay, a mismatch and a live holder cost one round trip. A claim that
// must change an existing record (retry, recovery, an expired record, the
// same token again) reads it under a row lock and changes it in the same
// transaction, following claim.lua step by step. A database that refuses
// writes (a hot standby, a role or session made read only) refuses the
// claim's statement: a completed key is then read and replayed, and any
// other claim is guard.ErrUnavailable.
func (s *Store) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if err := checkClaim(req); err != nil {
		return guard.Outcome{}, err
	}
	fingerprint := req.Fingerprint
	// From here on, the fingerprint as the row keeps it (any bytes).
	req.Fingerprint = StoredText(req.Fingerprint)
	// A claimed row is kept until its lease ends and for the TTL after
	// that, as the Redis store keeps a pending record (retention + lease):
	// a TTL shorter than the lease must not forget an abandoned claim
	// before the next one can recover it (its attempts and steps).
	keep := req.TTL + req.Lease
	if keep < req.TTL {
		keep = math.MaxInt64
	}
	leaseUS, keepUS := req.Lease.Microseconds(), keep.Microseconds()
	for range 8 {
		var inserted int
		var r claimRow
		err := s.queryRow(ctx, s.q.claimNew, []any{req.Key.Scope, req.Key.ID, req.Fingerprint, req.Token, leaseUS, keepUS},
			append([]any{&inserted}, r.dest()...)...)
		if err != nil {
			err = dbErr(ctx, "claim", err)
			if pgsql.ReadOnly(err) {
				if out, ok := s.replayRead(ctx, req.Key, fingerprint); ok {
					return out, nil
				}
			}
			return guard.Outcome{}, err
		}
		if inserted == 1 {
			return acquired(req, 1, 1, false), nil
		}
		if r.status.Valid { // the record as last committed: answer if reading is enough
			out, act, err := r.decide(req)
			if err != nil || act == actNone {
				return out, err
			}
		}
		out, found, err := s.claimLocked(ctx, req, leaseUS, keepUS)
		if err != nil || found {
			return out, err
		}
		// The row went away before it could be locked: insert again.
	}
	return guard.Outcome{}, fmt.Errorf("%w: claim %s: the record kept vanishing", guard.ErrUnavailable, req.Key)
}

// replayRead answers a claim the database refused as read only (a hot
// standby, a role or session made read only) when a read is enough: the
// key is completed with fingerprint, and the claim is its Replay, which
// writes nothing (the claim's INSERT would have done nothing either). As
// the Redis store replays under OOM (docs/design.md, failure modes). Any
// other record, or none, needs a write or may have changed on the
// primary a replica lags behind: ok is false, and the claim stays
// unavailable. A completed record changes only when its retention ends,
// which the read honours (by the clock of the server it reads, as every
// statement measures time by the database's).
func (s *Store) replayRead(ctx context.Context, key guard.Key, fingerprint string) (guard.Outcome, bool) {
	rec, err := s.Get(ctx, key)
	if err != nil || rec.State != guard.StateCompleted || rec.Fingerprint != fingerprint {
		return guard.Outcome{}, false
	}
	res := rec.Result
	if res == nil {
		res = []byte{}
	}
	return guard.Outcome{Status: guard.Replay, Result: res}, true
}

func acquired(req guard.ClaimRequest, fence int64, attempt int, recovered bool) guard.Outcome {
	return guard.Outcome{Status: guard.Acquired, Lease: guard.Lease{
		Key: req.Key, Token: req.Token, Fence: fence, Attempt: attempt, Recovered: recovered,
	}}
}

// claimRow is a record as a claim reads it.
type claimRow struct {
	fp, status, token, lastErr sql.NullString
	fence                      sql.NullInt64
	attempt                    sql.NullInt64
	recovered, expired, alive  sql.NullBool
	result                     []byte
	leftUS                     int64
	steps                      []byte
}

func (r *claimRow) dest() []any {
	return []any{&r.fp, &r.status, &r.token, &r.fence, &r.attempt, &r.recovered, &r.result, &r.lastErr,
		&r.expired, &r.alive, &r.leftUS, &r.steps}
}

// claimAction is the write a claim must make on an existing record.
type claimAction uint8

const (
	actNone    claimAction = iota
	actReset               // retention passed: start afresh
	actReclaim             // the same token claims again: renew its lease
	actExhaust             // the last attempt's holder died: record the failure
	actRetake              // failed, or the holder died: next attempt
)

// decide is claim.lua's logic over a record r: the answer, and the write it
// needs (made under the row lock by the caller).
func (r *claimRow) decide(req guard.ClaimRequest) (guard.Outcome, claimAction, error) {
	if r.expired.Bool {
		// Retention passed: the key is absent and starts afresh, but its
		// fence keeps growing while the row exists (until Purge), so a
		// holder from before can never pass for a later one.
		return acquired(req, r.fence.Int64+1, 1, false), actReset, nil
	}
	// A different payload under the same key learns nothing else about it.
	if r.fp.String != req.Fingerprint {
		if _, err := readText(req.Key, "fingerprint", r.fp.String); err != nil {
			return guard.Outcome{}, actNone, err // unreadable: no answer, not a mismatch
		}
		return guard.Outcome{Status: guard.Mismatch}, actNone, nil
	}
	attempt := int(r.attempt.Int64)
	switch r.status.String {
	case "completed":
		res := r.result
		if res == nil {
			res = []byte{}
		}
		return guard.Outcome{Status: guard.Replay, Result: res}, actNone, nil
	case "pending":
		if r.token.String == req.Token {
			// The same claim sent again: the same answer, lease renewed
			// (never shortened: the holder may have extended it).
			return r.withSteps(acquired(req, r.fence.Int64, attempt, r.recovered.Bool), actReclaim)
		}
		if r.alive.Bool {
			left := max(pgsql.Micros(r.leftUS), time.Microsecond)
			return guard.Outcome{Status: guard.InProgress, LeaseLeft: left}, actNone, nil
		}
	case "failed":
		if r.token.String == req.Token {
			// A copy of this claim that comes after its holder failed or
			// released it (database/sql sends a statement again when the
			// driver reports its connection bad after sending it): it
			// takes nothing, as claim.lua answers (docs/design.md, rule 2).
			return guard.Outcome{Status: guard.InProgress}, actNone, nil
		}
	default:
		return guard.Outcome{}, actNone, fmt.Errorf("%w: %s has state %q", guard.ErrCorrupt, req.Key, r.status.String)
	}
	// Failed, or pending with its lease gone (the holder died): take it over.
	recovering := r.status.String == "pending"
	if req.MaxAttempts > 0 && attempt >= req.MaxAttempts {
		if recovering {
			return guard.Outcome{Status: guard.Exhausted, Attempts: attempt, LastError: "lease expired"}, actExhaust, nil
		}
		reason, err := readText(req.Key, "last_error", r.lastErr.String)
		if err != nil {
			return guard.Outcome{}, actNone, err
		}
		return guard.Outcome{Status: guard.Exhausted, Attempts: attempt, LastError: reason}, actNone, nil
	}
	return r.withSteps(acquired(req, r.fence.Int64+1, attempt+1, recovering), actRetake)
}

// claimLocked decides a claim on an existing row while holding its lock,
// and makes the write the decision needs. found is false when the row is
// gone.
func (s *Store) claimLocked(ctx context.Context, req guard.ClaimRequest, leaseUS, keepUS int64) (out guard.Outcome, found bool, err error) {
	// READ COMMITTED, whatever the database's default: the row lock
	// orders the claims of one key, and each reads what the one before
	// it committed (a stricter level would refuse it instead).
	tx, err := pgsql.BeginTx(ctx, s.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return out, false, dbErr(ctx, "claim", err)
	}
	defer func() { _ = tx.Rollback() }()
	var r claimRow
	err = tx.QueryRowContext(ctx, s.q.selectForUpdate, req.Key.Scope, req.Key.ID).Scan(r.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return out, false, nil
	}
	if err != nil {
		return out, false, dbErr(ctx, "claim", err)
	}
	out, act, err := r.decide(req)
	if err != nil || act == actNone {
		return out, true, err
	}
	sc, id := req.Key.Scope, req.Key.ID
	switch act {
	case actReset:
		_, err = tx.ExecContext(ctx, s.q.resetExpired, sc, id, req.Fingerprint, req.Token, leaseUS, keepUS)
	case actReclaim:
		_, err = tx.ExecContext(ctx, s.q.reclaim, sc, id, leaseUS)
	case actExhaust:
		_, err = tx.ExecContext(ctx, s.q.exhaust, sc, id, out.LastError)
	case actRetake:
		_, err = tx.ExecContext(ctx, s.q.retake, sc, id, req.Token, out.Lease.Recovered, leaseUS, keepUS)
	}
	if err != nil {
		return out, true, dbErr(ctx, "claim", err)
	}
	if err := tx.Commit(); err != nil {
		return guard.Outcome{}, true, dbErr(ctx, "claim commit", err)
	}
	return out, true, nil
}

// Complete implements guard.Store.
func (s *Store) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if result == nil {
		result = []byte{}
	}
	return s.finish(ctx, "complete", s.q.complete, "completed", false, lease, result, ttl)
}

// Fail implements guard.Store.
func (s *Store) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	return s.finish(ctx, "fail", s.q.fail, "failed", true, lease, StoredText(reason), ttl)
}

// finish moves the holder's pending record to state; repeating it after it
// succeeded succeeds again, and so does repeating a failure (byPtok) after
// another claim took the key over from it (the record's ptok).
func (s *Store) finish(ctx context.Context, what, q, state string, byPtok bool, lease guard.Lease, value any, ttl time.Duration) error {
	key, token := lease.Key, lease.Token
	if ttl <= 0 {
		return fmt.Errorf("pgstore: %s: ttl %s is not positive", what, ttl)
	}
	res, err := s.exec(ctx, q, key.Scope, key.ID, token, value, ttl.Microseconds())
	if err != nil {
		return dbErr(ctx, what, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var st string
	var holds bool
	err = s.queryRow(ctx, s.q.checkDone, []any{key.Scope, key.ID, token}, &st, &holds)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return guard.ErrLeaseLost
	case err != nil:
		return dbErr(ctx, what, err)
	case holds && st == state:
		return nil // the same call again
	case !holds && byPtok && token != "":
		return nil // a retry of this failure, after another claim took the key over
	}
	return guard.ErrLeaseLost
}

// Release implements guard.Store. A first attempt's record is expired
// (absent to every call, its fence still growing on the next claim, until
// Purge deletes it); a later one, or one with steps (in its record, or a
// row backstop.Backstop.CommitStep committed), returns to failed with the
// attempt uncounted, so the fence still only grows.
func (s *Store) Release(ctx context.Context, lease guard.Lease) error {
	key, token := lease.Key, lease.Token
	for _, q := range []string{s.q.releaseFirst, s.q.releaseLater} {
		res, err := s.exec(ctx, q, key.Scope, key.ID, token)
		if err != nil {
			return dbErr(ctx, "release", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
	}
	var st, tok, ptok string
	err := s.queryRow(ctx, s.q.releaseCheck, []any{key.Scope, key.ID}, &st, &tok, &ptok)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil // already gone
	case err != nil:
		return dbErr(ctx, "release", err)
	case tok == token && st == "failed":
		return nil // released before
	case tok != token && ptok == token && token != "":
		return nil // a retry of this release, after another claim took the key over
	}
	return guard.ErrLeaseLost
}

// Extend implements guard.Store. A holder whose lease ran out keeps the key
// until someone else claims it.
func (s *Store) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("pgstore: extend: lease %s is not positive", d)
	}
	res, err := s.exec(ctx, s.q.extend, lease.Key.Scope, lease.Key.ID, lease.Token, d.Microseconds())
	if err != nil {
		return dbErr(ctx, "extend", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return guard.ErrLeaseLost
	}
	return nil
}

// Get implements guard.Store.
func (s *Store) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	rec := guard.Record{Key: key}
	var status string
	var leftUS, ttlUS int64
	var steps []byte
	err := s.queryRow(ctx, s.q.get, []any{key.Scope, key.ID}, &rec.Fingerprint, &status, &rec.Token,
		&rec.Fence, &rec.Attempt, &rec.Recovered, &rec.Result, &rec.LastError, &leftUS, &ttlUS, &steps)
	if errors.Is(err, sql.ErrNoRows) {
		return guard.Record{}, guard.ErrNotFound
	}
	if err != nil {
		return guard.Record{}, dbErr(ctx, "get", err)
	}
	st, ok := guard.ParseState(status)
	if !ok {
		return guard.Record{}, fmt.Errorf("%w: %s has state %q", guard.ErrCorrupt, key, status)
	}
	rec.State = st
	if rec.Fingerprint, err = readText(key, "fingerprint", rec.Fingerprint); err != nil {
		return guard.Record{}, err
	}
	if rec.LastError, err = readText(key, "last_error", rec.LastError); err != nil {
		return guard.Record{}, err
	}
	if st == guard.StatePending && leftUS > 0 {
		rec.LeaseLeft = pgsql.Micros(leftUS)
	}
	if ttlUS > 0 {
		rec.TTL = pgsql.Micros(ttlUS)
	}
	if st == guard.StateCompleted && rec.Result == nil {
		rec.Result = []byte{}
	}
	if rec.Steps, err = decodeSteps(steps); err != nil {
		return guard.Record{}, fmt.Errorf("%s: %w", key, err)
	}
	return rec, nil
}
