package guard

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/scripts"
)

// DefaultPrefix starts the name of every Redis key the RedisStore writes.
const DefaultPrefix = "idem:"

// RedisOptions configure a RedisStore. The zero value is ready to use.
type RedisOptions struct {
	// Prefix starts every Redis key name. Default DefaultPrefix.
	Prefix string

	// Unpipelined sends every script on a connection of its own.
	//
	// By default a store on a *redis.Client or *redis.ClusterClient sends
	// a call made while DirectCalls or more others are under way through the
	// client's deferred autopipeliner (go-redis AsyncAutoPipeline,
	// configured by the client's Options.AutoPipelineOptions), which
	// writes the scripts of concurrent calls to Redis in shared
	// pipelines: under heavy concurrency that saves most round trips and
	// the CPU they cost, and lifts throughput well past one connection per
	// call (README, Performance). Fewer calls at once go straight out,
	// which is as quick or quicker. Scripts and their answers are the same
	// either way. A pipelined call waits no longer than its context
	// allows, even though the script may still run after that, as after
	// any lost reply. Other clients are always unpipelined. go-redis
	// (v9.23) marks its autopipeliner experimental: set Unpipelined when
	// building against another go-redis version than go.mod names.
	Unpipelined bool

	// DirectCalls is how many calls of a pipelined store may be under way,
	// each on a connection of its own, before further calls share
	// pipelines. 0 means DefaultDirectCalls; a negative value pipelines
	// every call.
	DirectCalls int
}

// DefaultDirectCalls is RedisOptions.DirectCalls when unset. Up to it, a
// connection per call was as quick or quicker; past it, the round trips
// that pipelines save were worth the hand-over to the autopipeliner
// (idemguard bench against Redis on the same 2 cores, 1 to 64 workers).
const DefaultDirectCalls = 16

// RedisStore is a Store on Redis: standalone, Sentinel or Cluster, through
// any go-redis UniversalClient. Each call is one script. A key's record hash
// and lease string share one hash tag, so a Cluster keeps them on one slot.
type RedisStore struct {
	client redis.UniversalClient
	prefix string
	pipe   autopipeliner // nil: unpipelined

	direct   int64        // RedisOptions.DirectCalls
	inflight atomic.Int64 // calls under way, when pipelined
}

// autopipeliner is the client's AsyncAutoPipeline, or an error if it has
// none (a closed client).
type autopipeliner func() (*redis.AutoPipeliner, error)

var _ Store = (*RedisStore)(nil)

// NewRedisStore returns a Store on client. It does not touch the network;
// call LoadScripts at start-up so the first calls need no EVAL.
func NewRedisStore(client redis.UniversalClient, opts RedisOptions) *RedisStore {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.DirectCalls == 0 {
		opts.DirectCalls = DefaultDirectCalls
	}
	s := &RedisStore{client: client, prefix: opts.Prefix, direct: max(int64(opts.DirectCalls), 0)}
	if !opts.Unpipelined {
		switch c := client.(type) {
		case *redis.Client:
			s.pipe = c.AsyncAutoPipeline
		case *redis.ClusterClient:
			s.pipe = c.AsyncAutoPipeline
		}
	}
	return s
}

// Client returns the Redis client the store uses.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// LoadScripts loads every script into the script cache (on every master of
// a Cluster), so calls go out as EVALSHA. Scripts missing later (a
// restarted server) are sent again by EVAL on demand.
func (s *RedisStore) LoadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, sc := range scripts.All() {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return storeErr(ctx, err)
			}
		}
		return nil
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, s.client)
}

// Names returns the Redis key names of key: its record hash and its lease.
// Both carry the same hash tag, a digest of scope and ID, so any key bytes
// are safe and a Cluster keeps the pair on one slot.
func (s *RedisStore) Names(key Key) (record, lease string) {
	// The digest input is length(scope) | scope | id, so ("ab","c") and
	// ("a","bc") differ. Small keys hash from the stack.
	var buf [320]byte
	in := binary.BigEndian.AppendUint32(buf[:0], uint32(len(key.Scope)))
	in = append(append(in, key.Scope...), key.ID...)
	sum := sha256.Sum256(in)

	const suffix = leaseSuffix
	var tag [22]byte // base64 of the first 16 bytes of the digest
	base64.RawURLEncoding.Encode(tag[:], sum[:16])
	full := make([]byte, 0, len(s.prefix)+len(tag)+2+len(suffix))
	full = append(full, s.prefix...)
	full = append(append(append(full, '{'), tag[:]...), '}')
	full = append(full, suffix...)
	lease = string(full) // one allocation for both names
	return lease[:len(lease)-len(suffix)], lease
}

// leaseNames is a RedisStore's record name for a lease's key, computed
// once by Claim and carried in the Lease to the holder's later writes.
type leaseNames struct {
	key    Key    // the key it was derived from
	record string // the record's name, under the issuing store's prefix
}

const leaseSuffix = ":lease"

func (s *RedisStore) keys(key Key) []string {
	rec, lease := s.Names(key)
	return []string{rec, lease}
}

// leaseKeys returns the names of l's key: from the record name its Claim
// computed, when a store with this prefix issued l for l.Key, else
// derived again.
func (s *RedisStore) leaseKeys(l Lease) []string {
	n := l.names
	if n.key == l.Key && len(n.record) == len(s.prefix)+24 && strings.HasPrefix(n.record, s.prefix) {
		return []string{n.record, n.record + leaseSuffix}
	}
	return s.keys(l.Key)
}

// Claim implements Store.
func (s *RedisStore) Claim(ctx context.Context, req ClaimRequest) (Outcome, error) {
	keys := s.keys(req.Key)
	reply, err := s.run(ctx, scripts.Claim, keys,
		req.Token, req.Fingerprint, ms(req.Lease), ms(req.TTL),
		req.MaxAttempts, req.Key.Scope, req.Key.ID).Slice()
	if err != nil {
		return Outcome{}, storeErr(ctx, err)
	}
	out, err := decodeClaim(reply)
	if err != nil {
		return Outcome{}, err
	}
	if out.Status == Acquired {
		out.Lease.Key, out.Lease.Token = req.Key, req.Token
		out.Lease.names = leaseNames{key: req.Key, record: keys[0]}
	}
	return out, nil
}

// decodeClaim reads claim.lua's reply.
func decodeClaim(r []any) (Outcome, error) {
	bad := func() (Outcome, error) { return Outcome{}, fmt.Errorf("%w: claim reply %v", ErrCorrupt, r) }
	if len(r) == 0 {
		return bad()
	}
	code, ok := r[0].(int64)
	if !ok {
		return bad()
	}
	switch {
	case code == 1 && len(r) == 4:
		fence, ok1 := r[1].(int64)
		att, ok2 := r[2].(int64)
		rcv, ok3 := r[3].(int64)
		if !ok1 || !ok2 || !ok3 {
			return bad()
		}
		return Outcome{Status: Acquired, Lease: Lease{Fence: fence, Attempt: int(att), Recovered: rcv == 1}}, nil
	case code == 2 && len(r) == 2:
		ms, ok := r[1].(int64)
		if !ok {
			return bad()
		}
		return Outcome{Status: InProgress, LeaseLeft: time.Duration(ms) * time.Millisecond}, nil
	case code == 3 && len(r) == 2:
		res, _ := r[1].(string) // a missing result reads as nil: an empty one
		return Outcome{Status: Replay, Result: []byte(res)}, nil
	case code == 4:
		return Outcome{Status: Mismatch}, nil
	case code == 5 && len(r) == 3:
		att, ok1 := r[1].(int64)
		reason, ok2 := r[2].(string)
		if !ok1 || !ok2 {
			return bad()
		}
		return Outcome{Status: Exhausted, Attempts: int(att), LastError: reason}, nil
	}
	return bad()
}

// Complete implements Store.
func (s *RedisStore) Complete(ctx context.Context, lease Lease, result []byte, ttl time.Duration) error {
	return s.write(ctx, scripts.Complete, lease, result, ms(ttl))
}

// Fail implements Store.
func (s *RedisStore) Fail(ctx context.Context, lease Lease, reason string, ttl time.Duration) error {
	return s.write(ctx, scripts.Fail, lease, reason, ms(ttl))
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, lease Lease) error {
	return s.write(ctx, scripts.Release, lease)
}

// Extend implements Store.
func (s *RedisStore) Extend(ctx context.Context, lease Lease, d time.Duration) error {
	return s.write(ctx, scripts.Extend, lease, ms(d))
}

// run runs sc: as EVALSHA, and as EVAL if the server does not have it
// (a restarted or flushed server).
func (s *RedisStore) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.pipe == nil {
		return sc.Run(ctx, s.client, keys, args...)
	}
	defer s.inflight.Add(-1)
	if s.inflight.Add(1) <= s.direct {
		return sc.Run(ctx, s.client, keys, args...)
	}
	ap, err := s.pipe()
	if err != nil {
		return failed(ctx, err)
	}
	cmd := submit(ctx, ap, "evalsha", sc.Hash(), keys, args)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd = submit(ctx, ap, "eval", scripts.Source(sc), keys, args)
	}
	return cmd
}

// submit sends one EVAL or EVALSHA through ap and waits for its reply or
// for ctx to end. The script may still run after ctx ended: the outcome
// is then unknown, as after any lost reply.
func submit(ctx context.Context, ap *redis.AutoPipeliner, eval, script string, keys []string, args []any) *redis.Cmd {
	all := make([]any, 0, 3+len(keys)+len(args))
	all = append(all, eval, script, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	cmd := redis.NewCmd(ctx, append(all, args...)...)
	cmd.SetFirstKeyPos(3)
	if err := ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil {
		// The autopipeliner may still fill cmd in: hand back another.
		return failed(ctx, err)
	}
	return cmd
}

// failed is a command whose answer is err.
func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// ms converts a duration for PX/PEXPIRE, which refuse zero: at least 1ms.
func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// write runs a compare-and-set script that answers 1 (OK) or 0 (LOST).
func (s *RedisStore) write(ctx context.Context, sc *redis.Script, lease Lease, args ...any) error {
	n, err := s.run(ctx, sc, s.leaseKeys(lease), append([]any{lease.Token}, args...)...).Int64()
	if err != nil {
		return storeErr(ctx, err)
	}
	if n != 1 {
		return ErrLeaseLost
	}
	return nil
}

// Get implements Store.
func (s *RedisStore) Get(ctx context.Context, key Key) (Record, error) {
	reply, err := s.run(ctx, scripts.Get, s.keys(key)).Slice()
	if err != nil {
		return Record{}, storeErr(ctx, err)
	}
	if len(reply) != 3 {
		return Record{}, fmt.Errorf("%w: get reply %v", ErrCorrupt, reply)
	}
	flat, _ := reply[0].([]any)
	leaseMS, _ := reply[1].(int64)
	ttlMS, _ := reply[2].(int64)
	if len(flat) == 0 {
		return Record{}, ErrNotFound
	}
	fields := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		fields[k] = v
	}
	rec, err := DecodeRecord(fields)
	if err != nil {
		return Record{}, err
	}
	if rec.State == StatePending && leaseMS > 0 {
		rec.LeaseLeft = time.Duration(leaseMS) * time.Millisecond
	}
	if ttlMS > 0 {
		rec.TTL = time.Duration(ttlMS) * time.Millisecond
	}
	return rec, nil
}

// DecodeRecord reads a record from the fields of its Redis hash. Fields it
// cannot read give an error wrapping ErrCorrupt, never a panic.
func DecodeRecord(f map[string]string) (Record, error) {
	var rec Record
	switch f["st"] {
	case "p":
		rec.State = StatePending
	case "c":
		rec.State = StateCompleted
	case "f":
		rec.State = StateFailed
	default:
		return Record{}, fmt.Errorf("%w: state %q", ErrCorrupt, f["st"])
	}
	fence, err := strconv.ParseInt(f["fen"], 10, 64)
	if err != nil || fence < 1 {
		return Record{}, fmt.Errorf("%w: fence %q", ErrCorrupt, f["fen"])
	}
	att, err := strconv.Atoi(f["att"])
	if err != nil || att < 0 {
		return Record{}, fmt.Errorf("%w: attempts %q", ErrCorrupt, f["att"])
	}
	tok, ok := f["tok"]
	if !ok || tok == "" {
		return Record{}, fmt.Errorf("%w: no owner token", ErrCorrupt)
	}
	rec.Key = Key{Scope: f["sc"], ID: f["id"]}
	rec.Fingerprint = f["fp"]
	rec.Token = tok
	rec.Fence = fence
	rec.Attempt = att
	rec.Recovered = f["rcv"] == "1"
	rec.LastError = f["err"]
	if res, ok := f["res"]; ok {
		rec.Result = []byte(res)
	}
	return rec, nil
}

// storeErr maps a go-redis error to the guard's: transport failures and
// the server's "try later" replies wrap ErrUnavailable, a cancelled context
// is returned as it is, anything else (a script bug) is wrapped plainly.
func storeErr(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !isTryLater(rerr.Error()) {
		return fmt.Errorf("redis: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

func isTryLater(msg string) bool {
	for _, p := range []string{"LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "MOVED", "ASK", "OOM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
