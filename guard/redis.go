package guard

import (
	"bytes"
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
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/scripts"
)

// DefaultPrefix starts the name of every Redis key the RedisStore writes.
const DefaultPrefix = "idem:"

// RedisOptions configure a RedisStore. The zero value is ready to use.
type RedisOptions struct {
	// Prefix starts every Redis key name. Default DefaultPrefix. Names
	// are the prefix and 24 characters; with a prefix of 7 characters or
	// more Redis keeps each name in 48 bytes instead of 32.
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
	// which is quicker for one to a few callers. Scripts and their
	// answers are the same either way. A pipelined call waits no longer
	// than its context allows, even though the script may still run after
	// that, as after any lost reply. Other clients are always unpipelined. go-redis
	// (v9.23) marks its autopipeliner experimental: set Unpipelined when
	// building against another go-redis version than go.mod names.
	Unpipelined bool

	// DirectCalls is how many calls of a pipelined store may be under way,
	// each on a connection of its own, before further calls share
	// pipelines. 0 means DefaultDirectCalls; a negative value pipelines
	// every call.
	DirectCalls int

	// PlainScripts sends the scripts without their flag line
	// (scripts.AllowOOM), for a server whose Lua cannot read it:
	// miniredis. A store that meets the refusal switches by itself, at
	// the cost of two more round trips for its first script; this saves
	// them. A store on Redis 7 must not set it: the writes that end a
	// claim would then be refused while the server is out of memory.
	PlainScripts bool
}

// DefaultDirectCalls is RedisOptions.DirectCalls when unset. Up to it, a
// connection per call was quicker; past it, the round trips that pipelines
// save were worth the hand-over to the autopipeliner (idemguard bench
// against Redis on the same 2 cores, go-redis v9.23, 6 to 64 workers,
// thresholds 4, 8 and 16, alternated: at 6 and 8 workers, 8 ran 1.3-1.6x
// as many fresh keys and HTTP requests as 4 and up to 1.45x as many
// replays, at half the median latency; from 12 to 64 workers the two were
// alike; 16 cost a second HTTP p99 at 16 workers).
const DefaultDirectCalls = 8

// RedisStore is a Store on Redis: standalone, Sentinel or Cluster, through
// any go-redis UniversalClient. It needs Redis 7.0 or later (SET … NX GET)
// or miniredis.
//
// Each logical key is one Redis string (RedisStore.Name) holding the
// record in a compact binary format (record.go, scripts/record.lua): a
// completed record with a 200-byte result costs 394 bytes of Redis memory
// (Redis 7.0, a prefix of at most 6 characters; README, Memory). A fresh claim and a replay are one native command, SET NX GET;
// the other changes are Lua scripts that compare the owner token first.
// Fingerprints longer than 16 bytes are kept as 16 bytes of their SHA-256;
// fences stop at RedisMaxFence. A pending record's key lives for retention
// + lease and its lease is its PTTL minus the retention, so the server's
// clock alone judges it.
//
// A value the store cannot read whole (another format, another type such
// as the hash of idemguard's first layout, a truncated or altered value)
// gives a *CorruptError from every call on that key; nothing runs and
// nothing is written over it.
type RedisStore struct {
	client redis.UniversalClient
	prefix string
	pipe   autopipeliner // nil: unpipelined
	raw    bool          // a *redis.Client: claims read their reply raw
	// plain: the server refused to compile a script's flag line
	// (miniredis): scripts go plain (scripts.Plain).
	plain atomic.Bool

	direct   int64        // RedisOptions.DirectCalls
	inflight atomic.Int64 // calls under way, when pipelined
}

// autopipeliner is the client's AsyncAutoPipeline, or an error if it has
// none (a closed client).
type autopipeliner func() (*redis.AutoPipeliner, error)

var (
	_ Store         = (*RedisStore)(nil)
	_ StepStore     = (*RedisStore)(nil)
	_ DeadlineStore = (*RedisStore)(nil)
)

// NewRedisStore returns a Store on client. It does not touch the network;
// call LoadScripts at start-up so the first calls need no EVAL.
//
// It panics on a nil client, as New does on a nil store.
func NewRedisStore(client redis.UniversalClient, opts RedisOptions) *RedisStore {
	if client == nil {
		panic("guard.NewRedisStore: nil client")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.DirectCalls == 0 {
		opts.DirectCalls = DefaultDirectCalls
	}
	s := &RedisStore{client: client, prefix: opts.Prefix, direct: max(int64(opts.DirectCalls), 0)}
	_, s.raw = client.(*redis.Client)
	s.plain.Store(opts.PlainScripts)
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

// HonoursDeadline implements DeadlineStore: it reports whether the
// store's client is a *redis.Client, *redis.ClusterClient or *redis.Ring
// built with ContextTimeoutEnabled, so that a call ends by its context's
// deadline even when the server does not answer (a pipelined call always
// does; see RedisOptions.Unpipelined).
func (s *RedisStore) HonoursDeadline() bool {
	switch c := s.client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Prefix returns the prefix every key name of the store starts with.
func (s *RedisStore) Prefix() string { return s.prefix }

// LoadScripts loads every script into the script cache (on every master of
// a Cluster), so calls go out as EVALSHA. Scripts missing later (a
// restarted server) are sent again by EVAL on demand.
func (s *RedisStore) LoadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, sc := range scripts.All() {
			sc = s.variant(sc)
			err := sc.Load(ctx, c).Err()
			if s.flagsRefused(sc, err) {
				err = scripts.Plain(sc).Load(ctx, c).Err()
			}
			if err != nil {
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

// tagLen is the length of a name's hash tag: base64 of 16 digest bytes.
const tagLen = 22

// Name returns the Redis key that holds key's record: the prefix, then a
// hash tag of 22 characters, a digest of scope and ID, so any key bytes
// are safe and a Cluster routes by the tag. It is for operators and tools
// (redis-cli, MEMORY USAGE, idemguard inspect); the value under it is in
// the store's own format, which may change between versions: read it
// through Get, GetByName or ScanRecords.
func (s *RedisStore) Name(key Key) string {
	return string(s.appendName(make([]byte, 0, s.nameLen()), key))
}

func (s *RedisStore) nameLen() int { return len(s.prefix) + tagLen + 2 }

func (s *RedisStore) appendName(dst []byte, key Key) []byte {
	// The digest input is length(scope) | scope | id, so ("ab","c") and
	// ("a","bc") differ. Small keys hash from the stack.
	var buf [320]byte
	var sum [sha256.Size]byte
	if 4+len(key.Scope)+len(key.ID) <= len(buf) {
		in := binary.BigEndian.AppendUint32(buf[:0], uint32(len(key.Scope)))
		in = append(append(in, key.Scope...), key.ID...)
		sum = sha256.Sum256(in)
	} else {
		h := sha256.New()
		h.Write(binary.BigEndian.AppendUint32(buf[:0], uint32(len(key.Scope))))
		h.Write([]byte(key.Scope))
		h.Write([]byte(key.ID))
		h.Sum(sum[:0])
	}
	dst = append(append(dst, s.prefix...), '{')
	dst = base64.RawURLEncoding.AppendEncode(dst, sum[:16])
	return append(dst, '}')
}

// leaseNames is what a RedisStore's Claim computed for a lease, carried in
// the Lease to the holder's later writes so they need not compute it
// again. It is a comparable value: two answers to the same claim are
// equal Leases, until the holder records a step (pending is then the
// record with the steps).
type leaseNames struct {
	key   Key    // the key they were derived from
	token string // the token it was encoded from
	name  string // the record's name, under the issuing store's prefix
	tok   string // the token as records keep it
	// pending is the record the claim left, when the client knows it
	// byte for byte (its own first attempt), else ""; body is where its
	// body starts. Complete then needs no decoding in Redis.
	pending string
	body    int
}

// leaseNames returns what l's Claim computed, when a store with this
// prefix issued l for l.Key and l.Token, else the name and encoded token
// derived again (and no pending record).
func (s *RedisStore) leaseNames(l Lease) (leaseNames, error) {
	n := l.names
	if n.key == l.Key && n.token == l.Token && n.tok != "" &&
		len(n.name) == s.nameLen() && strings.HasPrefix(n.name, s.prefix) {
		return n, nil
	}
	tl := tokenLen(l.Token)
	if tl == 0 {
		return n, fmt.Errorf("idemguard: owner token of %d bytes: want 1 to %d", len(l.Token), maxRawToken)
	}
	return leaseNames{name: s.Name(l.Key), tok: string(appendToken(make([]byte, 0, tl), l.Token))}, nil
}

// acquired is the outcome of a claim that took the key; pending is the
// record it left, when known byte for byte, and body where its body starts.
func acquired(req *ClaimRequest, name, tok string, fence, attempt int64, recovered bool, pending string, body int) Outcome {
	return Outcome{Status: Acquired, Steps: pendingSteps(pending), Lease: Lease{
		Key: req.Key, Token: req.Token, Fence: fence, Attempt: int(attempt), Recovered: recovered,
		names: leaseNames{key: req.Key, token: req.Token, name: name, tok: tok, pending: pending, body: body},
	}}
}

// Claim implements Store. A fresh key and a replay take one native
// command, SET NX GET: it creates the first attempt's record, or leaves the
// record there and returns it. Only a record the client cannot answer from
// (another holder's, a failed or a released one) needs the claim script.
func (s *RedisStore) Claim(ctx context.Context, req ClaimRequest) (Outcome, error) {
	// The name and the first attempt's value share one allocation with
	// the command (most keys fit claimCall's buffer), and neither is
	// changed again: the lease keeps the name and the encoded token as
	// pieces of it, without copies.
	n, err := pendingLen(req)
	if err != nil {
		return Outcome{}, err
	}
	c := new(claimCall)
	p, buf := appendPending(room(c.mem[:], s.nameLen()+n)[:s.nameLen()], req)
	s.appendName(buf[:0], req.Key)
	all := unsafeString(buf)
	name, value := all[:s.nameLen()], all[s.nameLen():]
	tok := value[p.tok[0]:p.tok[1]]
	v, found, owned, err := s.setNXGet(ctx, c, name, value, p.ttl)
	switch {
	case refusesWrites(err):
		// A server out of memory, a primary without the replicas
		// min-replicas-to-write asks for, or one whose last background
		// save failed refuses every SET, even one that would write
		// nothing (refusesWrites); the script reads first and writes
		// only where the claim must, so replays and in-progress answers
		// still work.
	case err != nil:
		return Outcome{}, s.callErr(ctx, req.Key, name, err)
	case !found:
		return acquired(&req, name, tok, 1, 1, false, value, p.body), nil
	}
	if err == nil {
		if out, ok, err := answerFound(&req, name, tok, value[p.fp[0]:p.fp[1]], v, owned); ok {
			return out, err
		}
	}
	reply, err := s.script(ctx, scripts.Claim, []any{evalsha, nil, 1, name,
		tok, p.fpEnc(), ms(req.Lease), p.retention, req.MaxAttempts, p.keyEnc()}).Slice()
	if err != nil {
		return Outcome{}, s.callErr(ctx, req.Key, name, err)
	}
	out, err := decodeClaim(reply)
	if err != nil {
		return Outcome{}, err
	}
	if out.Status == Acquired {
		l := out.Lease
		out = acquired(&req, name, tok, l.Fence, int64(l.Attempt), l.Recovered, l.names.pending, l.names.body)
	}
	return out, nil
}

// answerFound answers a claim from the record its SET NX GET found, v,
// where no script is needed: a mismatch, a replay, or this claim sent
// again. ok is false when the claim script must decide. fp is the claim's
// encoded fingerprint; owned means v is a copy of the reply's own.
func answerFound(req *ClaimRequest, name, tok, fp, v string, owned bool) (out Outcome, ok bool, err error) {
	st, why := parseValue(v)
	if why != "" {
		return Outcome{}, true, &CorruptError{Key: req.Key, Name: name, Detail: why}
	}
	if st.state == stReleased {
		return Outcome{}, false, nil
	}
	// A different payload under the same key learns nothing else.
	if st.fp != fp {
		return Outcome{Status: Mismatch}, true, nil
	}
	switch {
	case st.state == stCompleted:
		return Outcome{Status: Replay, Result: resultBytes(st.result, owned)}, true, nil
	case st.state == stPending && st.tok == tok:
		// This claim sent again (a client retry after a lost reply).
		if owned {
			v = strings.Clone(v) // the lease keeps it; not the whole reply
		}
		return acquired(req, name, tok, st.fence, st.attempt, st.recovered, v, st.bodyStart(v)), true, nil
	}
	return Outcome{}, false, nil
}

// setCall is the arguments of a claim's SET NX GET in one allocation: the
// arguments point at its fields, so none is boxed on the heap.
type setCall struct {
	name, value string
	px          int64
	args        [7]any
}

// claimCall is what Claim allocates once: the SET NX GET's arguments, its
// command on a *redis.Client (raw), and room for the record's name and
// first attempt (a key whose scope and ID take up to about 180 bytes).
type claimCall struct {
	setCall
	raw redis.RawCmd
	mem [256]byte
}

// setNXGet sends SET name value NX GET PX ttl and returns the value that
// was there (found), or none when this call created the key. owned: the
// value's bytes are a reply buffer no one else holds, which the caller may
// hand out as a []byte.
//
// On a *redis.Client the reply is read raw: go-redis treats the nil reply
// of a created key as an error, and checking whether to retry it costs
// about twenty allocations. Error replies are then go-redis-free too: a
// Redis error comes back as a respError.
func (s *RedisStore) setNXGet(ctx context.Context, cc *claimCall, name, value string, ttl int64) (v string, found, owned bool, err error) {
	c := &cc.setCall
	c.name, c.value, c.px = name, value, ttl
	c.args = [...]any{"set", &c.name, &c.value, "nx", "get", "px", &c.px}
	args := c.args[:]
	if !s.raw {
		cmd := redis.NewStringCmd(ctx, args...)
		abandoned, err := s.send(ctx, cmd)
		switch {
		case err == redis.Nil && !abandoned:
			return "", false, false, nil
		case err != nil:
			return "", false, false, err
		}
		return cmd.Val(), true, false, nil
	}
	cc.raw = *redis.NewRawCmd(ctx, args...) // a plain struct: made in place, no allocation of its own
	if _, err := s.send(ctx, &cc.raw); err != nil {
		return "", false, false, err
	}
	v, found, err = parseBulk(cc.raw.Val())
	return v, found, true, err
}

// resultBytes is a stored result as Outcome.Result: r itself when its
// bytes are an owned reply buffer, else a copy.
func resultBytes(r string, owned bool) []byte {
	if owned {
		return unsafe.Slice(unsafe.StringData(r), len(r))
	}
	return []byte(r)
}

// parseBulk reads a raw RESP reply that is a bulk string or nil.
func parseBulk(b []byte) (string, bool, error) {
	line, rest, ok := bytes.Cut(b, crlf)
	if !ok || len(line) == 0 {
		return "", false, fmt.Errorf("%w: reply %q", ErrCorrupt, b)
	}
	switch line[0] {
	case '_': // RESP3 null
		return "", false, nil
	case '-':
		return "", false, respError(line[1:])
	case '$', '!':
		n, err := strconv.Atoi(string(line[1:]))
		switch {
		case err == nil && n == -1 && line[0] == '$': // RESP2 null
			return "", false, nil
		case err != nil || n < 0 || len(rest) != n+2:
			return "", false, fmt.Errorf("%w: reply %q", ErrCorrupt, b)
		case line[0] == '!': // RESP3 blob error
			return "", false, respError(rest[:n])
		}
		return unsafeString(rest[:n]), true, nil
	}
	return "", false, fmt.Errorf("%w: reply %q", ErrCorrupt, b)
}

var crlf = []byte("\r\n")

// unsafeString views b as a string; b is a reply buffer nothing else holds
// or changes.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// respError is an error reply read raw. It is a redis.Error, as go-redis's
// own error replies are.
type respError string

func (e respError) Error() string { return string(e) }

// RedisError marks respError as a redis.Error.
func (respError) RedisError() {}

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
	case code == 1 && len(r) == 5:
		fence, ok1 := r[1].(int64)
		att, ok2 := r[2].(int64)
		rcv, ok3 := r[3].(int64)
		v, ok4 := r[4].(string)
		if !ok1 || !ok2 || !ok3 || !ok4 || fence < 1 || att < 1 {
			return bad()
		}
		st, why := parseValue(v)
		if why != "" || st.state != stPending {
			return bad()
		}
		return Outcome{Status: Acquired, Lease: Lease{Fence: fence, Attempt: int(att), Recovered: rcv == 1,
			names: leaseNames{pending: v, body: st.bodyStart(v)}}}, nil
	case code == 2 && len(r) == 2:
		ms, ok := r[1].(int64)
		if !ok {
			return bad()
		}
		return Outcome{Status: InProgress, LeaseLeft: time.Duration(ms) * time.Millisecond}, nil
	case code == 3 && len(r) == 2:
		res, ok := r[1].(string)
		if !ok {
			return bad()
		}
		return Outcome{Status: Replay, Result: []byte(res)}, nil
	case code == 4 && len(r) == 1:
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

// writeCall is the arguments of a write script in one allocation: the
// arguments point at its fields, so none is boxed on the heap.
type writeCall struct {
	name, tok, reason, pending string
	result                     bytesArg
	ms, body                   int64
	args                       [9]any
	cmd                        redis.Cmd // the script's command, made in place (scriptIn)
}

// bytesArg is a []byte argument passed by pointer (go-redis writes an
// encoding.BinaryMarshaler's bytes as they are).
type bytesArg struct{ b []byte }

// MarshalBinary returns the bytes.
func (a *bytesArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// newWrite starts a write's arguments for lease: EVALSHA's three, the
// record's name and the encoded token.
func (s *RedisStore) newWrite(lease Lease) (*writeCall, leaseNames, error) {
	w := new(writeCall)
	n, err := s.startWrite(w, lease)
	return w, n, err
}

// startWrite is newWrite in w's memory.
func (s *RedisStore) startWrite(w *writeCall, lease Lease) (leaseNames, error) {
	n, err := s.leaseNames(lease)
	if err != nil {
		return n, err
	}
	w.name, w.tok = n.name, n.tok
	w.args[0], w.args[1], w.args[2], w.args[3], w.args[4] = evalsha, nil, 1, &w.name, &w.tok
	return n, nil
}

// completeCall is what Complete allocates once: the write's arguments and
// command, and room for the completed record (a record with a result of
// up to about 250 bytes).
type completeCall struct {
	writeCall
	mem [320]byte
}

// Complete implements Store. When the lease knows the pending record its
// claim left, the client builds the completed record and the script only
// compares and sets it.
func (s *RedisStore) Complete(ctx context.Context, lease Lease, result []byte, ttl time.Duration) error {
	if err := positive("complete", lease.Key, "ttl", ttl); err != nil {
		return err
	}
	c := new(completeCall)
	w := &c.writeCall
	n, err := s.startWrite(w, lease)
	if err != nil {
		return err
	}
	w.ms, w.pending = ms(ttl), n.pending
	if n.pending != "" {
		w.result.b = appendCompleted(room(c.mem[:], len(n.pending)+len(result)), n.pending, n.body, result)
		w.body = int64(n.body)
	} else {
		w.result.b = append(appendUvarint(room(c.mem[:], maxUvarintLen+len(result)), int64(len(result))), result...)
	}
	w.args[5], w.args[6], w.args[7], w.args[8] = &w.ms, &w.pending, &w.result, &w.body
	return s.write(ctx, scripts.Complete, lease.Key, w, 9)
}

// room returns an empty buffer for at least n bytes: mem when they fit
// (a call's own storage), else a new one.
func room(mem []byte, n int) []byte {
	if n <= len(mem) {
		return mem[:0:len(mem)]
	}
	return make([]byte, 0, n)
}

// Fail implements Store.
func (s *RedisStore) Fail(ctx context.Context, lease Lease, reason string, ttl time.Duration) error {
	if err := positive("fail", lease.Key, "ttl", ttl); err != nil {
		return err
	}
	w, _, err := s.newWrite(lease)
	if err != nil {
		return err
	}
	w.reason, w.ms = reason, ms(ttl)
	w.args[5], w.args[6] = &w.reason, &w.ms
	return s.write(ctx, scripts.Fail, lease.Key, w, 7)
}

// FailHolder fails the attempt of the holder whose token lease carries,
// in its name, for an operator (idemguard release): as Fail, but only
// while the key's record is that holder's pending one (ErrLeaseLost
// otherwise: it ended its attempt, or another holder took the key), and,
// unless force, only once its lease has run out, judged by Redis when it
// writes (an *InProgressError, nothing written, while it is alive). Its
// later writes are then refused and the next claim takes the key over
// with the next fence.
func (s *RedisStore) FailHolder(ctx context.Context, lease Lease, reason string, ttl time.Duration, force bool) error {
	if err := positive("fail", lease.Key, "ttl", ttl); err != nil {
		return err
	}
	w, _, err := s.newWrite(lease)
	if err != nil {
		return err
	}
	who := "stale"
	if force {
		who = "force"
	}
	w.reason, w.ms = reason, ms(ttl)
	w.args[5], w.args[6], w.args[7] = &w.reason, &w.ms, who
	v, err := s.scriptIn(ctx, scripts.Fail, w.args[:8], &w.cmd).Int64()
	switch {
	case err != nil:
		return s.callErr(ctx, lease.Key, w.name, err)
	case v == 2:
		rec, gerr := s.Get(ctx, lease.Key)
		if gerr != nil || rec.LeaseLeft <= 0 {
			return &InProgressError{Key: lease.Key}
		}
		return &InProgressError{Key: lease.Key, RetryAfter: rec.LeaseLeft}
	case v != 1:
		return ErrLeaseLost
	}
	return nil
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, lease Lease) error {
	w, _, err := s.newWrite(lease)
	if err != nil {
		return err
	}
	return s.write(ctx, scripts.Release, lease.Key, w, 5)
}

// Extend implements Store.
func (s *RedisStore) Extend(ctx context.Context, lease Lease, d time.Duration) error {
	if err := positive("extend", lease.Key, "lease", d); err != nil {
		return err
	}
	w, _, err := s.newWrite(lease)
	if err != nil {
		return err
	}
	w.ms = ms(d)
	w.args[5] = &w.ms
	return s.write(ctx, scripts.Extend, lease.Key, w, 6)
}

// write runs a compare-and-set script on w's first n arguments; it
// answers 1 (OK) or 0 (LOST).
func (s *RedisStore) write(ctx context.Context, sc *redis.Script, key Key, w *writeCall, n int) error {
	v, err := s.scriptIn(ctx, sc, w.args[:n], &w.cmd).Int64()
	if err != nil {
		return s.callErr(ctx, key, w.name, err)
	}
	if v != 1 {
		return ErrLeaseLost
	}
	return nil
}

// Get implements Store.
func (s *RedisStore) Get(ctx context.Context, key Key) (Record, error) {
	name := s.Name(key)
	reply, err := s.script(ctx, scripts.Get, []any{evalsha, nil, 1, name}).Slice()
	if err != nil {
		return Record{}, s.callErr(ctx, key, name, err)
	}
	return s.decodeGet(key, name, reply)
}

// decodeGet reads get.lua's reply for the record of key at name.
func (s *RedisStore) decodeGet(key Key, name string, reply []any) (Record, error) {
	if len(reply) != 2 {
		return Record{}, fmt.Errorf("%w: get reply %v", ErrCorrupt, reply)
	}
	if reply[0] == nil {
		return Record{}, ErrNotFound
	}
	v, ok1 := reply[0].(string)
	pttl, ok2 := reply[1].(int64)
	if !ok1 || !ok2 {
		return Record{}, fmt.Errorf("%w: get reply %v", ErrCorrupt, reply)
	}
	st, why := parseValue(v)
	if why != "" {
		return Record{}, &CorruptError{Key: key, Name: name, Detail: why}
	}
	if st.state == stReleased {
		return Record{}, ErrNotFound
	}
	if st.state == stPending && pttl < 0 {
		// Its lease never runs out: every claim but its holder's is refused
		// (claim.lua), for good. Told as Claim tells it.
		return Record{}, &CorruptError{Key: key, Name: name, Detail: "pending record without expiry"}
	}
	rec := st.record(key)
	if pttl > 0 {
		rec.TTL = time.Duration(pttl) * time.Millisecond
		if st.state == stPending && pttl > st.retention {
			rec.LeaseLeft = time.Duration(pttl-st.retention) * time.Millisecond
		}
	}
	return rec, nil
}

// GetByName reads the record a RedisStore keeps under the Redis key name
// (from ScanRecords, Name or a log, for operator tools): like Get, but the
// Record's Key is the scope and ID the record keeps, which a completed
// record does not (its Key is then zero). ErrNotFound when there is none.
func (s *RedisStore) GetByName(ctx context.Context, name string) (Record, error) {
	reply, err := s.script(ctx, scripts.Get, []any{evalsha, nil, 1, name}).Slice()
	if err != nil {
		return Record{}, s.callErr(ctx, Key{}, name, err)
	}
	return s.decodeGet(Key{}, name, reply)
}

// script runs sc with all = {evalsha, nil, 1, the record's name, ARGV...}:
// the first three slots are the command's, filled in here, so the caller's
// slice is the command's arguments. It sends EVALSHA, and EVAL if the
// server does not have the script (a restarted or flushed server).
func (s *RedisStore) script(ctx context.Context, sc *redis.Script, all []any) *redis.Cmd {
	return s.scriptIn(ctx, sc, all, new(redis.Cmd))
}

// scriptIn is script with the EVALSHA command made in cmd's memory (a
// redis.Cmd is a plain struct), so a caller that keeps one beside the
// arguments allocates it with them.
func (s *RedisStore) scriptIn(ctx context.Context, sc *redis.Script, all []any, cmd *redis.Cmd) *redis.Cmd {
	sc = s.variant(sc)
	all[0], all[1], all[2] = evalsha, scriptHash(sc), 1
	*cmd = *redis.NewCmd(ctx, all...)
	cmd.SetFirstKeyPos(3)
	abandoned, err := s.send(ctx, cmd)
	if !abandoned && isNoScript(err) {
		cmd = evalCmd(ctx, sc, all) // the first command may still hold all
		abandoned, err = s.send(ctx, cmd)
		if !abandoned && s.flagsRefused(sc, err) {
			cmd = evalCmd(ctx, scripts.Plain(sc), all)
			abandoned, err = s.send(ctx, cmd)
		}
	}
	if abandoned {
		return failed(ctx, err) // the autopipeliner may still fill cmd in
	}
	return cmd
}

// evalCmd is the EVAL of sc with the arguments of all = {evalsha, hash,
// 1, the record's name, ARGV...}, in a slice of its own.
func evalCmd(ctx context.Context, sc *redis.Script, all []any) *redis.Cmd {
	args := append([]any{"eval", scripts.Source(sc)}, all[2:]...)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// variant is sc as this store sends it: plain (scripts.Plain) once the
// server has refused to compile a flag line.
func (s *RedisStore) variant(sc *redis.Script) *redis.Script {
	if s.plain.Load() {
		return scripts.Plain(sc)
	}
	return sc
}

// flagsRefused reports whether err is the server's refusal to compile sc
// for its flag line (scripts.AllowOOM): miniredis, or Redis before 7.0.
// The store then sends every script plain, and a holder's writes are
// refused while the server is out of memory, as other writes are.
func (s *RedisStore) flagsRefused(sc *redis.Script, err error) bool {
	if err == nil || scripts.Plain(sc) == sc || !strings.Contains(err.Error(), "Error compiling script") {
		return false
	}
	s.plain.Store(true)
	return true
}

// Scripts returns the scripts the store sends: scripts.All(), or
// scripts.AllPlain() once the server has refused to compile a flag line.
// A health check asks the server for these.
func (s *RedisStore) Scripts() []*redis.Script {
	if s.plain.Load() {
		return scripts.AllPlain()
	}
	return scripts.All()
}

const evalsha = "evalsha"

// hashes are the scripts' SHA1 digests, as arguments that need no boxing.
var hashes = func() map[*redis.Script]*string {
	m := map[*redis.Script]*string{}
	for _, sc := range append(scripts.All(), scripts.AllPlain()...) {
		h := sc.Hash()
		m[sc] = &h
	}
	return m
}()

func scriptHash(sc *redis.Script) any {
	if h, ok := hashes[sc]; ok {
		return h
	}
	return sc.Hash()
}

// send sends cmd: straight out, or through the autopipeliner when
// DirectCalls others are under way, and returns its error. A pipelined
// command waits no longer than ctx; when ctx ends first, send returns
// abandoned and ctx's error, and cmd must not be read: the autopipeliner
// may still fill it in, and the command may still run, as after any lost
// reply.
func (s *RedisStore) send(ctx context.Context, cmd redis.Cmder) (abandoned bool, err error) {
	if s.pipe == nil {
		_ = s.client.Process(ctx, cmd)
		return false, cmd.Err()
	}
	defer s.inflight.Add(-1)
	if s.inflight.Add(1) <= s.direct {
		_ = s.client.Process(ctx, cmd)
		return false, cmd.Err()
	}
	ap, err := s.pipe()
	if err != nil {
		return true, err
	}
	// WaitContext answers ctx's error when it stopped waiting, and the
	// command's own otherwise (its reply, redis.Nil included, is there).
	if err := ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && err == ctx.Err() {
		return true, err
	}
	return false, cmd.Err()
}

// failed is a command whose answer is err.
func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// ms converts a positive duration for PX/PEXPIRE, which refuse zero: at
// least 1ms.
func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// positive refuses a lease or retention (what) of a call on key that is
// not positive, as every store does: rounded up to 1ms instead, a
// completion would be forgotten at once, and its effect run again.
func positive(call string, key Key, what string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("idemguard: %s of %s: %s %s is not positive", call, key, what, d)
	}
	return nil
}

// callErr maps the error of a call on key's record: a value the scripts or
// the server could not read as a record is a *CorruptError; anything else
// goes to storeErr.
func (s *RedisStore) callErr(ctx context.Context, key Key, name string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if detail, ok := strings.CutPrefix(msg, scripts.CorruptPrefix+" "); ok {
			return &CorruptError{Key: key, Name: name, Detail: strings.TrimSuffix(detail, " at "+name)}
		}
		if strings.HasPrefix(msg, "WRONGTYPE") {
			return &CorruptError{Key: key, Name: name,
				Detail: "not a string: a record of another layout (idemguard before record format 1 kept a hash), or not idemguard's"}
		}
	}
	return storeErr(ctx, err)
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

// refusesWrites reports whether err is Redis's refusal of a write command
// whatever it would write: used memory over maxmemory (with the
// noeviction policy), fewer replicas than min-replicas-to-write, or a
// failed background save (stop-writes-on-bgsave-error). The claim
// script, which reads first, still runs there.
func refusesWrites(err error) bool {
	if err == nil {
		return false // before rerr, which escapes: a claim's usual path allocates nothing here
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "OOM ") || strings.HasPrefix(msg, "NOREPLICAS ") || strings.HasPrefix(msg, "MISCONF ")
}

// isTryLater reports whether msg is a reply that says the server cannot
// answer now, not that the call is wrong. NOSCRIPT among them: the store
// answers it with EVAL where it sends EVALSHA, but a server that lost its
// scripts (restarted, flushed, failed over) has lost nothing of the call,
// and one that reaches a caller all the same (it did once, in a
// kill-and-restart storm) is answered by a retry.
func isTryLater(msg string) bool {
	for _, p := range []string{"LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOREPLICAS", "MISCONF", "MOVED", "ASK", "OOM", "NOSCRIPT"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
