package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemguard/idemguard/guard"
)

// MemoryOptions shape Target.Memory. The zero value is ready to use.
type MemoryOptions struct {
	// Records is how many completed records to write. Default 20,000.
	Records int
	// ResultSize is the size in bytes of each stored result. Default 200.
	ResultSize int
	// Scope of every key; the IDs are random UUIDs. Default
	// "tenant-42/POST /orders".
	Scope string
	// Concurrency is how many Guard.Do calls run at once. Default 64.
	Concurrency int
	// Settle bounds the wait for Redis's memory figure to stop moving
	// after the writes (its hash tables grow by incremental rehashing,
	// which frees the old table a little later). Default 10s.
	Settle time.Duration
}

func (o MemoryOptions) withDefaults() MemoryOptions {
	if o.Records <= 0 {
		o.Records = 20000
	}
	if o.ResultSize <= 0 {
		o.ResultSize = 200
	}
	if o.Scope == "" {
		o.Scope = "tenant-42/POST /orders"
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Settle <= 0 {
		o.Settle = 10 * time.Second
	}
	return o
}

// MemoryResult is what Target.Memory measured.
type MemoryResult struct {
	Records        int
	ResultSize     int
	BytesPerRecord float64 // used_memory growth over the writes, per record
	ValueBytes     float64 // mean length of a record's Redis value (STRLEN)
	Settled        bool    // used_memory stopped moving within Settle
	Before, After  int64   // used_memory less the clients' buffers, around the writes
}

// Memory writes Records completed records through Guard.Do (the store's
// defaults, retention an hour) and reports the growth of Redis's
// used_memory (INFO memory, less mem_clients_normal: the connections'
// buffers) per record, then removes them. On a server other clients
// write to, their writes count too: use a Redis of its own.
func (t *Target) Memory(ctx context.Context, opts MemoryOptions) (MemoryResult, error) {
	if t.mr != nil {
		return MemoryResult{}, errors.New("bench: memory: miniredis has no memory figure; give a Redis address")
	}
	if opts.Records < 0 || opts.ResultSize < 0 || opts.Concurrency < 0 || opts.Settle < 0 {
		return MemoryResult{}, errors.New("bench: memory: records, result size, concurrency and settle must not be negative")
	}
	opts = opts.withDefaults()
	// A prefix of 6 characters: a record's name is then 30, which Redis
	// keeps in 32 bytes (a 1-byte header, the name, a NUL), as it keeps
	// the default prefix's ("idem:", 29 characters). Prefixes of 7 or more
	// characters cost 16 bytes more per record (jemalloc's next class).
	prefix := "ib" + strings.ToLower(rand.Text()[:3]) + ":"
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = t.cleanup(cctx, prefix+"{") // the records' names only
	}()
	g := guard.New(t.newStore(guard.RedisOptions{Prefix: prefix}), guard.Options{TTL: time.Hour})
	res := make([]byte, opts.ResultSize)
	for i := range res {
		res[i] = 'a' + byte(i%26)
	}
	fn := func(context.Context, guard.Lease) ([]byte, error) { return res, nil }
	// UUID keys, and fingerprints as httpx.DefaultFingerprint makes them
	// (64 hex digits, which the store keeps as a 16-byte digest).
	ids, fps := make([]string, opts.Records), make([]string, opts.Records)
	for i := range ids {
		ids[i] = uuid.NewString()
		sum := sha256.Sum256([]byte(ids[i]))
		fps[i] = hex.EncodeToString(sum[:])
	}

	out := MemoryResult{Records: opts.Records, ResultSize: opts.ResultSize}
	// The connections and the scripts' first runs happen before the first
	// reading: what they cost Redis once is not the records'.
	warm := prefix + "warm:"
	wg := guard.New(t.newStore(guard.RedisOptions{Prefix: warm}), guard.Options{TTL: time.Hour})
	_, _, _, err := drive(ctx, opts.Concurrency, int64(4*opts.Concurrency), 0, func(ctx context.Context, i int64) error {
		_, err := wg.Do(ctx, guard.Key{Scope: opts.Scope, ID: strconv.FormatInt(i, 10)}, "fp", fn)
		return err
	})
	if err == nil {
		err = t.cleanup(ctx, warm)
	}
	if err != nil {
		return out, fmt.Errorf("bench: memory: warming up: %w", err)
	}
	before, _, err := t.settledMemory(ctx, opts.Settle)
	if err != nil {
		return out, err
	}
	_, _, _, err = drive(ctx, opts.Concurrency, int64(opts.Records), 0, func(ctx context.Context, i int64) error {
		r, err := g.Do(ctx, guard.Key{Scope: opts.Scope, ID: ids[i]}, fps[i], fn)
		if err == nil && r.Replayed {
			err = fmt.Errorf("new key %s replayed", ids[i])
		}
		return err
	})
	if err != nil {
		return out, fmt.Errorf("bench: memory: %w", err)
	}
	after, settled, err := t.settledMemory(ctx, opts.Settle)
	if err != nil {
		return out, err
	}
	out.Before, out.After, out.Settled = before, after, settled
	out.BytesPerRecord = float64(after-before) / float64(opts.Records)

	// The values' own size, from a sample.
	store := t.newStore(guard.RedisOptions{Prefix: prefix})
	var sum, n int64
	for i := 0; i < len(ids) && n < 200; i += max(1, len(ids)/200) {
		l, err := t.client.StrLen(ctx, store.Name(guard.Key{Scope: opts.Scope, ID: ids[i]})).Result()
		if err != nil {
			return out, fmt.Errorf("bench: memory: %w", err)
		}
		sum += l
		n++
	}
	if n > 0 {
		out.ValueBytes = float64(sum) / float64(n)
	}
	return out, nil
}

// settledMemory reads used_memory until two readings 300ms apart agree,
// or limit passed (settled false).
func (t *Target) settledMemory(ctx context.Context, limit time.Duration) (int64, bool, error) {
	deadline := time.Now().Add(limit)
	last, err := t.usedMemory(ctx)
	if err != nil {
		return 0, false, err
	}
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(300 * time.Millisecond): // waiting for the server's incremental rehashing
		}
		now, err := t.usedMemory(ctx)
		if err != nil {
			return 0, false, err
		}
		if now == last {
			return now, true, nil
		}
		last = now
	}
	return last, false, nil
}

// usedMemory is INFO memory's used_memory less mem_clients_normal: the
// connections' buffers grow and shrink with the traffic (Redis resizes
// them when idle), which is not the records' memory.
func (t *Target) usedMemory(ctx context.Context) (int64, error) {
	info, err := t.client.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("bench: memory: INFO memory: %w", err)
	}
	var used, clients int64 = -1, -1
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		switch name {
		case "used_memory":
			used, err = strconv.ParseInt(v, 10, 64)
		case "mem_clients_normal":
			clients, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return 0, fmt.Errorf("bench: memory: INFO memory %s: %w", name, err)
		}
	}
	if used < 0 || clients < 0 {
		return 0, errors.New("bench: memory: INFO memory has no used_memory or mem_clients_normal")
	}
	return used - clients, nil
}

// WriteMemory writes m and a sizing table: Redis memory for the records
// kept at several rates of new keys and retentions, at m.BytesPerRecord
// each.
func WriteMemory(w io.Writer, m MemoryResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d completed records with a %d-byte result: %.0f bytes of Redis memory each (used_memory less clients' buffers %d → %d",
		m.Records, m.ResultSize, m.BytesPerRecord, m.Before, m.After)
	if !m.Settled {
		b.WriteString(", still moving when read")
	}
	fmt.Fprintf(&b, "); the value itself is %.0f bytes.\n\n", m.ValueBytes)
	b.WriteString("| new keys/s | kept 24 h | kept 7 days | kept 31 days |\n|--:|--:|--:|--:|\n")
	for _, rate := range []float64{100, 1000, 10000, 100000} {
		fmt.Fprintf(&b, "| %s |", strconv.FormatFloat(rate, 'f', -1, 64))
		for _, days := range []float64{1, 7, 31} {
			fmt.Fprintf(&b, " %s |", size(rate*days*86400*m.BytesPerRecord))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// size formats bytes in decimal units.
func size(n float64) string {
	for _, u := range []struct {
		unit string
		v    float64
	}{{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}} {
		if n >= u.v {
			return fmt.Sprintf("%.3g %s", n/u.v, u.unit)
		}
	}
	return fmt.Sprintf("%.0f kB", n/1e3)
}
