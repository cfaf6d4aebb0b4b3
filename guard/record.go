package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// A RedisStore keeps each key as one Redis string in the format below
// (version 1). scripts/record.lua reads and writes the same format; the two
// are held to one another by tests. docs/design.md ("The Redis record")
// explains each field and each script's cases.
//
//	version      1 byte, 1
//	state        1 byte: 'p' pending, 'c' completed, 'f' failed, 'r' released
//	             (a first attempt undone by Release: reads as absent); 'P',
//	             'C', 'F': the same, reached by recovering an expired lease
//	fence        uvarint, 1 .. RedisMaxFence
//	attempt      uvarint, 1 .. RedisMaxFence
//	fingerprint  kind byte 0..16 and that many bytes of the fingerprint, or
//	             255 and the first 16 bytes of its SHA-256
//	token        kind byte 1..239 and that many bytes, or 255 and 17 bytes:
//	             a 26-character base32 token (rand.Text) packed
//	ptok         the holder that ended its claim by Fail or Release before
//	             this one took over: kind byte 0 for none, else as token
//	last error   uvarint length, bytes
//	body         pending: uvarint retention ms, uvarint length + scope,
//	             uvarint length + id; failed: the scope and id alone;
//	             completed: uvarint length + result; released: nothing
//
// Version 2 is version 1 with recovery points (Step) after the body of a
// pending or failed record: see redis_step.go. A record without steps
// stays version 1, byte for byte.
//
// A uvarint is encoding/binary's (7 bits a byte, least significant first),
// at most 8 bytes, minimal, and at most RedisMaxFence. The value ends where
// its body ends. A completed record with a 200-byte result and the guard's
// own tokens is a value of 243 bytes (jemalloc's 256-byte class).
const (
	recordVersion = 1

	stPending   = 'p'
	stCompleted = 'c'
	stFailed    = 'f'
	stReleased  = 'r'

	kindPacked = 255 // token: 17 packed bytes; fingerprint: a 16-byte digest

	maxRawFingerprint = 16  // longer fingerprints are kept as a digest
	maxRawToken       = 239 // longer tokens cannot be stored
	packedTokenLen    = 17
	digestLen         = 16
	maxUvarintLen     = 8

	// fingerprintDigestPrefix starts Record.Fingerprint when a RedisStore
	// kept only the digest of a fingerprint longer than 16 bytes.
	fingerprintDigestPrefix = "sha256/128:"
)

// RedisMaxFence is the largest fence (and attempt count) a RedisStore
// keeps: 2^53−1, the largest integer its Lua scripts count exactly (Lua
// numbers are doubles). A claim that would take a record at this fence
// over fails with ErrCorrupt rather than hand out a fence that does not
// grow; at one new holder per millisecond a key reaches it after 285,000
// years.
const RedisMaxFence = 1<<53 - 1

// CorruptError is a stored record the guard cannot read whole. It matches
// ErrCorrupt. Nothing ran and nothing was written because of it: the key
// stays as it is until an operator removes it or it expires.
type CorruptError struct {
	Key    Key    // the logical key, when known (a Get by name does not know it)
	Name   string // the Redis key holding the record
	Detail string // what is wrong with it
}

func (e *CorruptError) Error() string {
	if e.Key == (Key{}) {
		return fmt.Sprintf("%s at %s: %s", ErrCorrupt, e.Name, e.Detail)
	}
	return fmt.Sprintf("%s: %s (redis key %s): %s", ErrCorrupt, e.Key, e.Name, e.Detail)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// stored is a record value split into its fields, each a substring of the
// value (no copies). fp, tok and ptok keep their encoded form.
type stored struct {
	state          byte // stPending, stCompleted, stFailed, stReleased
	recovered      bool
	fence, attempt int64
	fp, tok, ptok  string
	lastErr        string
	retention      int64 // pending: ms
	scope, id      string
	hasKey         bool // pending and failed records keep their key
	result         string
	steps          string // version 2: the steps, as the record keeps them
}

// parseValue splits a record value, or says what is wrong with it.
func parseValue(v string) (stored, string) {
	var s stored
	switch {
	case len(v) == 0:
		return s, "empty value"
	case v[0] != recordVersion && v[0] != recordVersionSteps:
		return s, "unknown version"
	case len(v) < 2:
		return s, "unknown state"
	}
	switch c := v[1]; c {
	case stPending, stCompleted, stFailed, stReleased:
		s.state = c
	case 'P', 'C', 'F':
		s.state, s.recovered = c+('a'-'A'), true
	default:
		return s, "unknown state"
	}
	i := 2
	var ok bool
	if s.fence, i, ok = uvarint(v, i); !ok || s.fence < 1 {
		return s, "fence out of range"
	}
	if s.attempt, i, ok = uvarint(v, i); !ok || s.attempt < 1 {
		return s, "attempts out of range"
	}
	if s.fp, i, ok = kindField(v, i, 0, maxRawFingerprint, digestLen); !ok {
		return s, "bad fingerprint"
	}
	if s.tok, i, ok = kindField(v, i, 1, maxRawToken, packedTokenLen); !ok || !canonical(s.tok) {
		return s, "bad token"
	}
	if s.ptok, i, ok = kindField(v, i, 0, maxRawToken, packedTokenLen); !ok || !canonical(s.ptok) {
		return s, "bad previous token"
	}
	if s.lastErr, i, ok = lenString(v, i); !ok {
		return s, "bad last error"
	}
	switch s.state {
	case stPending:
		if s.retention, i, ok = uvarint(v, i); !ok || s.retention < 1 {
			return s, "retention out of range"
		}
		fallthrough
	case stFailed:
		if s.scope, i, ok = lenString(v, i); ok {
			s.id, i, ok = lenString(v, i)
		}
		if !ok {
			return s, "bad key"
		}
		s.hasKey = true
	case stCompleted:
		if s.result, i, ok = lenString(v, i); !ok {
			return s, "completed without its result"
		}
	}
	if v[0] == recordVersionSteps {
		var why string
		if s.steps, i, why = parseSteps(v, i, s.state); why != "" {
			return s, why
		}
	}
	if i != len(v) {
		return s, "trailing bytes"
	}
	return s, ""
}

// uvarint reads a uvarint at i.
func uvarint(v string, i int) (n int64, next int, ok bool) {
	var u uint64
	for k := range maxUvarintLen {
		if i+k >= len(v) {
			return 0, i, false
		}
		b := v[i+k]
		if b < 0x80 {
			if b == 0 && k > 0 {
				return 0, i, false // not minimal
			}
			u |= uint64(b) << (7 * k)
			if u > RedisMaxFence {
				return 0, i, false
			}
			return int64(u), i + k + 1, true
		}
		u |= uint64(b&0x7f) << (7 * k)
	}
	return 0, i, false
}

func appendUvarint(dst []byte, n int64) []byte {
	u := uint64(n)
	for u >= 0x80 {
		dst = append(dst, byte(u)|0x80)
		u >>= 7
	}
	return append(dst, byte(u))
}

func uvarintLen(n int64) int {
	l := 1
	for u := uint64(n); u >= 0x80; u >>= 7 {
		l++
	}
	return l
}

// kindField reads a field led by a kind byte (kmin..kmax: that many bytes
// follow; kindPacked: packed bytes follow) and returns it whole.
func kindField(v string, i, kmin, kmax, packed int) (string, int, bool) {
	if i >= len(v) {
		return "", i, false
	}
	n := int(v[i])
	switch {
	case n == kindPacked:
		n = packed
	case n < kmin || n > kmax:
		return "", i, false
	}
	end := i + 1 + n
	if end > len(v) {
		return "", i, false
	}
	return v[i:end], end, true
}

// canonical reports whether an encoded token, if packed, packs 130 bits:
// its first byte holds the top 2.
func canonical(enc string) bool { return enc[0] != kindPacked || enc[1] <= 3 }

// lenString reads a uvarint length and that many bytes.
func lenString(v string, i int) (string, int, bool) {
	n, j, ok := uvarint(v, i)
	if !ok || n > int64(len(v)-j) {
		return "", i, false
	}
	return v[j : j+int(n)], j + int(n), true
}

const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" // rand.Text's

var base32Value = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := range len(base32Alphabet) {
		t[base32Alphabet[i]] = int8(i)
	}
	return t
}()

// packable reports whether tok is a 26-character base32 token, as
// rand.Text (the guard's tokens) makes them.
func packable(tok string) bool {
	if len(tok) != 26 {
		return false
	}
	for i := range len(tok) {
		if base32Value[tok[i]] < 0 {
			return false
		}
	}
	return true
}

// tokenLen is the encoded length of tok, or 0 if it cannot be stored.
func tokenLen(tok string) int {
	switch {
	case packable(tok):
		return 1 + packedTokenLen
	case len(tok) >= 1 && len(tok) <= maxRawToken:
		return 1 + len(tok)
	}
	return 0
}

// appendToken encodes tok; the caller checked tokenLen(tok) > 0.
func appendToken(dst []byte, tok string) []byte {
	if !packable(tok) {
		return append(append(dst, byte(len(tok))), tok...)
	}
	// 26 characters of 5 bits: 130 bits, in 17 bytes, big-endian, the
	// first 6 bits zero. The first two characters fill the first two
	// bytes; each following 8 make 5 bytes.
	v := func(i int) uint64 { return uint64(base32Value[tok[i]]) }
	head := v(0)<<5 | v(1)
	dst = append(dst, kindPacked, byte(head>>8), byte(head))
	for g := 2; g < 26; g += 8 {
		var x uint64
		for i := g; i < g+8; i++ {
			x = x<<5 | v(i)
		}
		dst = append(dst, byte(x>>32), byte(x>>24), byte(x>>16), byte(x>>8), byte(x))
	}
	return dst
}

// tokenString decodes an encoded token ("" for none or a bad one).
func tokenString(enc string) string {
	if len(enc) < 2 {
		return ""
	}
	if enc[0] != kindPacked {
		return enc[1:]
	}
	if len(enc) != 1+packedTokenLen || enc[1] > 3 {
		return ""
	}
	var out [26]byte
	head := uint64(enc[1])<<8 | uint64(enc[2])
	out[0], out[1] = base32Alphabet[head>>5], base32Alphabet[head&31]
	for g, o := 0, 2; g < 3; g, o = g+1, o+8 {
		b := enc[3+5*g:]
		x := uint64(b[0])<<32 | uint64(b[1])<<24 | uint64(b[2])<<16 | uint64(b[3])<<8 | uint64(b[4])
		for i := 7; i >= 0; i-- {
			out[o+i] = base32Alphabet[x&31]
			x >>= 5
		}
	}
	return string(out[:])
}

// fingerprintLen is the encoded length of fp.
func fingerprintLen(fp string) int {
	if len(fp) <= maxRawFingerprint {
		return 1 + len(fp)
	}
	return 1 + digestLen
}

// appendFingerprint encodes fp: itself when short, else its digest.
func appendFingerprint(dst []byte, fp string) []byte {
	if len(fp) <= maxRawFingerprint {
		return append(append(dst, byte(len(fp))), fp...)
	}
	var sum [sha256.Size]byte
	var buf [512]byte
	if len(fp) <= len(buf) {
		sum = sha256.Sum256(buf[:copy(buf[:], fp)]) // no copy on the heap
	} else {
		sum = sha256.Sum256([]byte(fp))
	}
	return append(append(dst, kindPacked), sum[:digestLen]...)
}

// fingerprintString is Record.Fingerprint of an encoded fingerprint.
func fingerprintString(enc string) string {
	if len(enc) == 0 {
		return ""
	}
	if enc[0] != kindPacked {
		return enc[1:]
	}
	return fingerprintDigestPrefix + hex.EncodeToString([]byte(enc[1:]))
}

// SameFingerprint reports whether fp is the fingerprint the record was
// claimed with. A RedisStore keeps a fingerprint longer than 16 bytes only
// as a digest (Record.Fingerprint then reads "sha256/128:" and 32 hex
// digits), so compare with this rather than ==.
func (r Record) SameFingerprint(fp string) bool {
	if r.Fingerprint == fp {
		return true
	}
	if len(fp) <= maxRawFingerprint || !strings.HasPrefix(r.Fingerprint, fingerprintDigestPrefix) {
		return false
	}
	var buf [1 + digestLen]byte
	return fingerprintString(string(appendFingerprint(buf[:0], fp))) == r.Fingerprint
}

// appendKey encodes a key as pending and failed records keep it.
func appendKey(dst []byte, k Key) []byte {
	dst = append(appendUvarint(dst, int64(len(k.Scope))), k.Scope...)
	return append(appendUvarint(dst, int64(len(k.ID))), k.ID...)
}

func keyLen(k Key) int {
	return uvarintLen(int64(len(k.Scope))) + len(k.Scope) + uvarintLen(int64(len(k.ID))) + len(k.ID)
}

// pendingValue is a first attempt's record, as the native claim writes it,
// with the offsets of its encoded fingerprint and token and of its key.
type pendingValue struct {
	buf            []byte
	fp, tok, key   [2]int // [start, end) in buf
	body           int    // where the body starts (after the last error)
	retention, ttl int64  // ms
}

func (p *pendingValue) fpEnc() []byte  { return p.buf[p.fp[0]:p.fp[1]] }
func (p *pendingValue) tokEnc() []byte { return p.buf[p.tok[0]:p.tok[1]] }
func (p *pendingValue) keyEnc() []byte { return p.buf[p.key[0]:p.key[1]] }

// newPending encodes req's first attempt in one allocation, after room
// for head more bytes (newPending's caller writes the record's name
// there: name and value then share the allocation). p.buf is the value;
// all is the whole allocation.
func newPending(req ClaimRequest, head int) (p pendingValue, all []byte, err error) {
	n, err := pendingLen(req)
	if err != nil {
		return p, nil, err
	}
	p, all = appendPending(make([]byte, head, head+n), req)
	return p, all, nil
}

// pendingLen is the length of req's first attempt, or why it cannot be
// stored.
func pendingLen(req ClaimRequest) (int, error) {
	if err := req.Key.Validate(); err != nil {
		return 0, fmt.Errorf("idemguard: claim: %w", err)
	}
	tl := tokenLen(req.Token)
	if tl == 0 {
		return 0, fmt.Errorf("idemguard: owner token of %d bytes: want 1 to %d", len(req.Token), maxRawToken)
	}
	if err := positive("claim", req.Key, "lease", req.Lease); err != nil {
		return 0, err
	}
	if err := positive("claim", req.Key, "ttl", req.TTL); err != nil {
		return 0, err
	}
	if req.MaxAttempts < 0 {
		return 0, fmt.Errorf("idemguard: claim of %s: max attempts %d is negative", req.Key, req.MaxAttempts)
	}
	ret := ms(req.TTL)
	if ret > RedisMaxFence/2 || ms(req.Lease) > RedisMaxFence/2 {
		return 0, fmt.Errorf("idemguard: retention %s or lease %s too long", req.TTL, req.Lease)
	}
	return 2 + 1 + 1 + fingerprintLen(req.Fingerprint) + tl + 1 + 1 + uvarintLen(ret) + keyLen(req.Key), nil
}

// appendPending appends req's first attempt to all (pendingLen(req)
// checked it can be stored): p.buf is the value, from len(all) on.
func appendPending(all []byte, req ClaimRequest) (p pendingValue, _ []byte) {
	ret := ms(req.TTL)
	p = pendingValue{retention: ret, ttl: ret + ms(req.Lease)}
	head := len(all)
	b := all[head:]
	b = append(b, recordVersion, stPending, 1, 1) // fence 1, attempt 1
	p.fp[0] = len(b)
	b = appendFingerprint(b, req.Fingerprint)
	p.fp[1], p.tok[0] = len(b), len(b)
	b = appendToken(b, req.Token)
	p.tok[1] = len(b)
	b = append(b, 0, 0) // no ptok, no last error
	p.body = len(b)
	b = appendUvarint(b, ret)
	p.key[0] = len(b)
	b = appendKey(b, req.Key)
	p.key[1] = len(b)
	p.buf = b
	return p, all[:head+len(b)]
}

// bodyStart is where the body of a pending value v with fields s starts.
func (s stored) bodyStart(v string) int {
	return len(v) - len(s.steps) - uvarintLen(s.retention) - keyLen(Key{Scope: s.scope, ID: s.id})
}

// appendCompleted appends the completed record a pending value becomes:
// its state byte changed and its body replaced by result. body is where
// the pending value's body starts.
func appendCompleted(dst []byte, pending string, body int, result []byte) []byte {
	dst = append(append(dst, recordVersion, stCompleted), pending[2:body]...)
	if pending[1] != stPending {
		dst[len(dst)-body+1] = stCompleted - ('a' - 'A') // recovered
	}
	return append(appendUvarint(dst, int64(len(result))), result...)
}

// record is the Record a stored value describes, for key (or the key
// the value keeps when key is zero).
func (s stored) record(key Key) Record {
	rec := Record{
		Key:         key,
		Fingerprint: fingerprintString(s.fp),
		Token:       tokenString(s.tok),
		Fence:       s.fence,
		Attempt:     int(s.attempt),
		Recovered:   s.recovered,
		LastError:   s.lastErr,
		Steps:       decodeSteps(s.steps),
	}
	if key == (Key{}) && s.hasKey {
		rec.Key = Key{Scope: s.scope, ID: s.id}
	}
	switch s.state {
	case stPending:
		rec.State = StatePending
	case stCompleted:
		rec.State = StateCompleted
		rec.Result = []byte(s.result)
	case stFailed:
		rec.State = StateFailed
	}
	return rec
}

// DecodeRecord reads a record from the value a RedisStore keeps at a key's
// name (RedisStore.Name). Its Key is the scope and ID the record keeps
// while pending or failed; a completed record does not keep them. A
// released first attempt reads as ErrNotFound. A value it cannot read
// whole gives an error wrapping ErrCorrupt, never a panic. Lease and TTL
// are not in the value: RedisStore.Get reports them.
func DecodeRecord(value []byte) (Record, error) {
	s, why := parseValue(string(value))
	if why != "" {
		return Record{}, fmt.Errorf("%w: %s", ErrCorrupt, why)
	}
	if s.state == stReleased {
		return Record{}, ErrNotFound
	}
	return s.record(Key{}), nil
}
