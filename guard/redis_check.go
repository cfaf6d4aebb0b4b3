package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// CheckOptions configure RedisStore.Check. The zero value refuses any
// server that may evict keys.
type CheckOptions struct {
	// AcceptEviction lets Check pass a server whose maxmemory-policy is not
	// noeviction. Check then logs one warning naming the servers and their
	// policies, instead of returning an error. Only for servers that can
	// never reach their maxmemory: an evicted record or lease lets an
	// effect run again, and only the SQL backstop would catch it.
	AcceptEviction bool
	// Logger receives that warning. Default slog.Default().
	Logger *slog.Logger
}

// Check reads the eviction policy of the server, or of every master of a
// Cluster (every shard of a Ring), and returns an *EvictionError (matching
// ErrEviction) naming the first server whose maxmemory-policy is not
// noeviction: under every volatile-* and allkeys-* policy, Redis evicts
// keys that carry a TTL, as every record and lease does, and an evicted
// record lets its effect run again. Call it at start-up, after
// LoadScripts. It reads the policy with CONFIG GET maxmemory-policy, and
// from INFO memory where CONFIG is renamed or not allowed (managed Redis
// services); a server that allows neither gives an error saying so. A
// server that cannot be reached gives an error matching ErrUnavailable.
//
// With noeviction, a server that runs out of memory refuses writes with
// OOM; the store reports those as ErrUnavailable, and callers retry later.
// A Sentinel's replicas are not checked: configure them as the master.
func (s *RedisStore) Check(ctx context.Context, opts CheckOptions) error {
	var (
		mu  sync.Mutex
		bad []*EvictionError
	)
	check := func(ctx context.Context, c *redis.Client) error {
		policy, err := evictionPolicy(ctx, c)
		if err != nil {
			return fmt.Errorf("idemguard: check %s: %w", c.Options().Addr, err)
		}
		if policy != "noeviction" {
			mu.Lock()
			bad = append(bad, &EvictionError{Addr: c.Options().Addr, Policy: policy})
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Ring:
		err = c.ForEachShard(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		// Another UniversalClient: ask through it, naming no address.
		var policy string
		if policy, err = evictionPolicy(ctx, s.client); err != nil {
			err = fmt.Errorf("idemguard: check: %w", err)
		} else if policy != "noeviction" {
			bad = append(bad, &EvictionError{Addr: "the server", Policy: policy})
		}
	}
	if err != nil {
		return err
	}
	if len(bad) == 0 {
		return nil
	}
	slices.SortFunc(bad, func(a, b *EvictionError) int { return strings.Compare(a.Addr, b.Addr) })
	if !opts.AcceptEviction {
		return bad[0]
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	servers := make([]string, len(bad))
	for i, e := range bad {
		servers[i] = e.Addr + " " + e.Policy
	}
	log.WarnContext(ctx, "idemguard: Redis may evict idempotency records and leases (maxmemory-policy is not noeviction); "+
		"accepted by CheckOptions.AcceptEviction: an evicted record lets its effect run again",
		"servers", strings.Join(servers, ", "))
	return nil
}

// evictionPolicy reads c's maxmemory-policy: by CONFIG GET, or from INFO
// memory when CONFIG is refused.
func evictionPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
	m, cerr := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if cerr == nil {
		if p, ok := m["maxmemory-policy"]; ok && p != "" {
			return p, nil
		}
		cerr = errors.New("CONFIG GET maxmemory-policy: no value")
	} else if !isRedisError(cerr) {
		return "", storeErr(ctx, cerr)
	}
	info, ierr := c.Info(ctx, "memory").Result()
	if ierr != nil {
		if !isRedisError(ierr) {
			return "", storeErr(ctx, ierr)
		}
		return "", fmt.Errorf("cannot read maxmemory-policy: CONFIG GET: %w; INFO memory: %w", cerr, ierr)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok && v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("cannot read maxmemory-policy: CONFIG GET: %w; INFO memory has no maxmemory_policy", cerr)
}

// isRedisError reports whether err is the server's answer (an error
// reply), not a failure to reach it.
func isRedisError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}
