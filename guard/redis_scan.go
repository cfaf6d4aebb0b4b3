package guard

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/scripts"
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
// of a Ring, in no particular order, and read 64 to a round trip; fn is
// called from one goroutine at a time. A record kept for the whole scan is
// given, one written or removed while it runs may or may not be (SCAN's
// guarantee), and one may be given more than once: SCAN gives a name
// again when the server's table of keys shrinks while it runs, as it does
// when many records expire or are removed. On a Cluster whose slots move
// while the masters are scanned (a resharding), records of a slot that
// moved to a master already scanned would be missed: the masters are
// scanned again while any slot moved, or was moving, during the pass
// before, giving names again; after scanClusterPasses passes that met a
// resharding, ScanRecords returns ErrScanUnsettled. Callers that list or
// count records once keep the names given (idemguard list does). It
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
	emit := func(name string, rec Record, err error) bool {
		mu.Lock()
		defer mu.Unlock()
		more := !stopped && fn(name, rec, err)
		stopped = stopped || !more
		return more
	}
	scan := func(ctx context.Context, c redis.Cmdable) error {
		for cursor := uint64(0); ; {
			names, next, err := c.Scan(ctx, cursor, match, scanPage).Result()
			if err != nil {
				return storeErr(ctx, err)
			}
			for len(names) > 0 {
				n := min(len(names), scanReads)
				if err := s.readNames(ctx, names[:n], emit); err != nil {
					return err
				}
				names = names[n:]
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = scanCluster(ctx, c, scan)
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

// ErrScanUnsettled is returned by ScanRecords on a Cluster whose slots
// kept moving (a resharding) through every pass of its scan: records may
// have been missed; scan again once the resharding is over.
var ErrScanUnsettled = errors.New("guard: the Cluster's slots moved during every pass of the scan; records may be missing")

// scanClusterPasses bounds the passes of a Cluster's scan.
const scanClusterPasses = 3

// scanCluster scans every master of c (go-redis reloads the Cluster's
// layout for each pass), and all of them again while the masters' slots
// changed, or a slot was migrating, during the pass.
func scanCluster(ctx context.Context, c *redis.ClusterClient, scan func(context.Context, redis.Cmdable) error) error {
	before, err := slotLayout(ctx, c)
	if err != nil {
		return err
	}
	for pass := 1; ; pass++ {
		if scanPassHook != nil {
			scanPassHook(pass)
		}
		if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) }); err != nil {
			return err
		}
		after, err := slotLayout(ctx, c)
		if err != nil {
			return err
		}
		if after == before && !strings.Contains(after, "[") {
			return nil
		}
		if pass == scanClusterPasses {
			return ErrScanUnsettled
		}
		before = after
	}
}

// scanPassHook, when set (by tests), is called before each pass of a
// Cluster's scan.
var scanPassHook func(pass int)

// slotLayout describes which slots each master of c serves, with its
// config epoch, and which it is migrating or importing ("[slot->-node]",
// "[slot-<-node]"), as each master's CLUSTER NODES says of itself: the
// same string while no slot moved (a slot that moved away and back raised
// the epoch of the master that took it back).
func slotLayout(ctx context.Context, c *redis.ClusterClient) (string, error) {
	var mu sync.Mutex
	var own []string
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		nodes, err := n.ClusterNodes(ctx).Result()
		if err != nil {
			return storeErr(ctx, err)
		}
		for line := range strings.Lines(nodes) {
			f := strings.Fields(line)
			if len(f) >= 8 && slices.Contains(strings.Split(f[2], ","), "myself") {
				mu.Lock()
				// The config epoch too: a master raises it for every slot it
				// imports, so a slot that moved away and back during the
				// pass (the same slots before and after) still tells.
				own = append(own, f[0]+" "+f[6]+" "+strings.Join(f[8:], " "))
				mu.Unlock()
			}
		}
		return nil
	})
	slices.Sort(own)
	return strings.Join(own, "\n"), err
}

// scanPage is the COUNT of ScanRecords' SCAN calls, and scanReads how many
// of the names it finds are read in one pipeline: one round trip per 64
// records, not one each (120,000 records took 20-32 s one at a time), and
// at most 64 records held at once, however large their results.
const (
	scanPage  = 500
	scanReads = 64
)

// readNames reads the records of names in one pipeline and gives each to
// emit, as ScanRecords does; it returns errStopScan if emit asked to stop.
func (s *RedisStore) readNames(ctx context.Context, names []string, emit func(string, Record, error) bool) error {
	cmds := s.scripts(ctx, len(names), func(j int) (*redis.Script, []any) {
		return scripts.Get, []any{nil, nil, 1, names[j]}
	})
	for j, cmd := range cmds {
		reply, err := cmd.(*redis.Cmd).Slice()
		var rec Record
		if err != nil {
			err = s.callErr(ctx, Key{}, names[j], err)
		} else {
			rec, err = s.decodeGet(Key{}, names[j], reply)
		}
		switch {
		case errors.Is(err, ErrNotFound):
			continue
		case err != nil && !errors.Is(err, ErrCorrupt):
			return err
		}
		if !emit(names[j], rec, err) {
			return errStopScan
		}
	}
	return nil
}

// globEscape quotes the glob characters of s for SCAN MATCH. It goes byte
// by byte: a prefix is bytes, and one that is not UTF-8 must match itself
// (read as runes, a stray byte became U+FFFD, and the pattern matched no
// name of the store).
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
