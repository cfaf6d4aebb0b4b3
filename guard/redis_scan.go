package guard

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// errStopScan ends a scan whose callback asked to stop.
var errStopScan = errors.New("guard: scan stopped")

// ScanRecords calls fn with every record the store keeps under its prefix,
// for operator tools (idemguard list): the record's Redis name (Name) and
// the record as GetByName reads it. A record that cannot be read whole is
// given with its error (a *CorruptError, matching ErrCorrupt) and a zero
// Record; a name that vanished between the scan and the read (expired,
// released) is skipped. fn returns false to stop the scan.
//
// Records are found by SCAN, on every master of a Cluster and every shard
// of a Ring, in no particular order; fn is called from one goroutine at a
// time. A record written or removed while the scan runs may or may not be
// given (SCAN's guarantee), and one is never given twice by one server. It
// returns the first error of a scan or of a read that is not the record's
// own (the server unavailable, ctx ended), and nil if fn stopped it. A
// nil fn panics before the scan starts.
func (s *RedisStore) ScanRecords(ctx context.Context, fn func(name string, rec Record, err error) bool) error {
	if fn == nil {
		panic("guard.RedisStore.ScanRecords: nil func")
	}
	// The names are the prefix and a hash tag of tagLen characters.
	match := globEscape(s.prefix) + "{" + strings.Repeat("?", tagLen) + "}"
	var mu sync.Mutex // one fn at a time, across the masters of a Cluster
	stopped := false
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 500).Iterator()
		for iter.Next(ctx) {
			name := iter.Val()
			rec, err := s.GetByName(ctx, name)
			switch {
			case errors.Is(err, ErrNotFound):
				continue
			case err != nil && !errors.Is(err, ErrCorrupt):
				return err
			}
			mu.Lock()
			more := !stopped && fn(name, rec, err)
			stopped = stopped || !more
			mu.Unlock()
			if !more {
				return errStopScan
			}
		}
		if err := iter.Err(); err != nil {
			return storeErr(ctx, err)
		}
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	default:
		err = scan(ctx, s.client)
	}
	if errors.Is(err, errStopScan) {
		return nil
	}
	return err
}

// globEscape quotes the glob characters of s for SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
