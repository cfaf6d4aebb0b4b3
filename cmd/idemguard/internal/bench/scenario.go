package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// Scenario names. Every guard row has a baseline in the same transport
// mode: the guard's default store shares pipelines through go-redis's
// autopipeliner past RedisOptions.DirectCalls calls at once, so its rows
// compare with the -auto baselines; the -unpipelined rows send each call
// on a connection of its own, like the plain baselines.
const (
	Fresh             = "fresh"              // Guard.Do on a new key: claim + complete
	FreshUnpipelined  = "fresh-unpipelined"  // the same, each call on a connection of its own
	ClaimComplete     = "claim-complete"     // Guard.Claim + Guard.Complete, no Do machinery
	StoreFresh        = "store-fresh"        // RedisStore.Claim + RedisStore.Complete: the store alone, no Guard
	StoreReplay       = "store-replay"       // RedisStore.Claim of a completed key: the store alone
	Replay            = "replay"             // Guard.Do on a completed key: one claim, a replay
	ReplayUnpipelined = "replay-unpipelined" // the same, each call on a connection of its own
	Storm             = "storm"              // Guard.Do, Keys × Duplicates sent at once
	StormUnpipelined  = "storm-unpipelined"  // the same, each call on a connection of its own
	SetNXSet          = "setnx+set"          // baseline: SET NX PX, then SET PX: two round trips
	SetNXSetPipe      = "setnx+set-pipe"     // baseline: the same two in one pipeline
	SetNXSetAuto      = "setnx+set-auto"     // baseline: the two through the client's autopipeliner
	Get               = "get"                // baseline of a replay: a plain GET of a stored value
	GetAuto           = "get-auto"           // baseline: the GET through the client's autopipeliner
	NaiveStorm        = "naive-storm"        // GET, run, SETEX under the same storm as Storm
	NaiveStormAuto    = "naive-storm-auto"   // the same through the client's autopipeliner
	Memory            = "memory"             // not a row: bytes of Redis memory per completed record (Target.Memory)
)

// scenario is one kind of row.
type scenario struct {
	name     string
	about    string
	baseline string // the row this one is compared to
	storm    bool   // runs Keys × Duplicates and counts effects per key
	// prepare sets up the row and returns its operation.
	prepare func(ctx context.Context, e *env) (op, error)
}

// env is what a row's operations share.
type env struct {
	t      *Target
	opts   Options
	prefix string // every key of the row starts with it
	close  func() // run after the row, if set

	counts    []atomic.Int32 // storm rows: effects per key
	effects   atomic.Int64   // replay rows: effects that should not happen
	replays   atomic.Int64
	conflicts atomic.Int64
}

// guard returns a Guard on the target writing under the row's prefix,
// with the store's default: scripts share the client's pipelines.
func (e *env) guard() *guard.Guard { return e.guardWith(guard.RedisOptions{}) }

// guardWith is guard with the store options o (its Prefix is the row's).
func (e *env) guardWith(o guard.RedisOptions) *guard.Guard {
	o.Prefix = e.prefix
	return guard.New(e.t.newStore(o), guard.Options{TTL: e.opts.TTL})
}

var unpipelined = guard.RedisOptions{Unpipelined: true}

// cmdable is the plain client, or its autopipeliner for the -auto rows.
func (e *env) cmdable(auto bool) (redis.Cmdable, error) {
	if !auto {
		return e.t.client, nil
	}
	return e.t.client.AsyncAutoPipeline()
}

func (e *env) result() []byte {
	b := make([]byte, e.opts.ResultSize)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

// effect runs the business effect of storm key k.
func (e *env) effect(k int64) {
	e.counts[k].Add(1)
	if e.opts.Work > 0 {
		time.Sleep(e.opts.Work) // the simulated side effect itself
	}
}

// stormKey is the key of storm operation i: Duplicates consecutive
// operations share a key, so they are in flight together.
func (e *env) stormKey(i int64) int64 { return i / int64(e.opts.Duplicates) }

var scenarios = []scenario{
	{name: Fresh, baseline: SetNXSetAuto, about: "Guard.Do on a new key (claim + complete), the store's default: calls share pipelines past 8 at once", prepare: prepareFresh(guard.RedisOptions{})},
	{name: FreshUnpipelined, baseline: SetNXSet, about: "Guard.Do on a new key, RedisOptions.Unpipelined", prepare: prepareFresh(unpipelined)},
	{name: ClaimComplete, baseline: SetNXSetAuto, about: "Guard.Claim + Guard.Complete on a new key", prepare: prepareClaimComplete},
	{name: StoreFresh, baseline: SetNXSetAuto, about: "RedisStore.Claim + RedisStore.Complete on a new key, no Guard: what the store costs", prepare: prepareStoreFresh},
	{name: StoreReplay, baseline: GetAuto, about: "RedisStore.Claim of a completed key, no Guard: what the store costs", prepare: prepareStoreReplay},
	{name: Replay, baseline: GetAuto, about: "Guard.Do on a completed key (a replay)", prepare: prepareReplay(guard.RedisOptions{})},
	{name: ReplayUnpipelined, baseline: Get, about: "Guard.Do on a completed key, RedisOptions.Unpipelined", prepare: prepareReplay(unpipelined)},
	{name: Storm, baseline: NaiveStormAuto, storm: true, about: "Guard.Do under Keys × Duplicates concurrent duplicates", prepare: prepareStorm(guard.RedisOptions{})},
	{name: StormUnpipelined, baseline: NaiveStorm, storm: true, about: "the storm, RedisOptions.Unpipelined", prepare: prepareStorm(unpipelined)},
	{name: SetNXSet, about: "baseline: SET NX PX, then SET PX (two round trips)", prepare: prepareSetNXSet(false)},
	{name: SetNXSetPipe, about: "baseline: SET NX PX and SET PX in one pipeline", prepare: prepareSetNXSetPipe},
	{name: SetNXSetAuto, about: "baseline: SET NX PX, then SET PX, through the client's autopipeliner", prepare: prepareSetNXSet(true)},
	{name: Get, about: "baseline: GET of a stored result", prepare: prepareGet(false)},
	{name: GetAuto, about: "baseline: GET of a stored result through the client's autopipeliner", prepare: prepareGet(true)},
	{name: NaiveStorm, storm: true, about: "baseline: GET, run, SETEX under the same storm", prepare: prepareNaiveStorm(false)},
	{name: NaiveStormAuto, storm: true, about: "baseline: GET, run, SETEX under the same storm, through the client's autopipeliner", prepare: prepareNaiveStorm(true)},
}

func lookup(name string) (scenario, bool) {
	for _, s := range scenarios {
		if s.name == name {
			return s, true
		}
	}
	return scenario{}, false
}

func names() string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// Scenarios lists every scenario name, guard rows first.
func Scenarios() []string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return n
}

// About describes a scenario in a line.
func About(name string) string {
	s, _ := lookup(name)
	return s.about
}

// Baseline names the scenario a row is compared to (a baseline in the same
// transport mode), or "".
func Baseline(name string) string {
	s, _ := lookup(name)
	return s.baseline
}

// IsStorm reports whether a scenario counts effects per key.
func IsStorm(name string) bool {
	s, _ := lookup(name)
	return s.storm
}

func idOf(i int64) string { return strconv.FormatInt(i, 10) }

const scope = "bench"

func prepareFresh(o guard.RedisOptions) func(context.Context, *env) (op, error) {
	return func(_ context.Context, e *env) (op, error) {
		g, res := e.guardWith(o), e.result()
		fn := func(context.Context, guard.Lease) ([]byte, error) { return res, nil }
		return func(ctx context.Context, i int64) error {
			r, err := g.Do(ctx, guard.Key{Scope: scope, ID: idOf(i)}, "fp", fn)
			if err == nil && r.Replayed {
				return fmt.Errorf("fresh key %d replayed", i)
			}
			return err
		}, nil
	}
}

func prepareClaimComplete(_ context.Context, e *env) (op, error) {
	g, res := e.guard(), e.result()
	return func(ctx context.Context, i int64) error {
		out, err := g.Claim(ctx, guard.Key{Scope: scope, ID: idOf(i)}, "fp")
		if err != nil {
			return err
		}
		if out.Status != guard.Acquired {
			return fmt.Errorf("fresh key %d: %s", i, out.Status)
		}
		return g.Complete(ctx, out.Lease, res)
	}, nil
}

func (e *env) store() *guard.RedisStore {
	return e.t.newStore(guard.RedisOptions{Prefix: e.prefix})
}

func (e *env) claimRequest(i int64) guard.ClaimRequest {
	return guard.ClaimRequest{Key: guard.Key{Scope: scope, ID: idOf(i)}, Token: rand.Text(), Fingerprint: "fp",
		Lease: guard.DefaultLease, TTL: e.opts.TTL}
}

func prepareStoreFresh(_ context.Context, e *env) (op, error) {
	s, res := e.store(), e.result()
	return func(ctx context.Context, i int64) error {
		out, err := s.Claim(ctx, e.claimRequest(i))
		if err != nil {
			return err
		}
		if out.Status != guard.Acquired {
			return fmt.Errorf("fresh key %d: %s", i, out.Status)
		}
		return s.Complete(ctx, out.Lease, res, e.opts.TTL)
	}, nil
}

func prepareStoreReplay(ctx context.Context, e *env) (op, error) {
	s := e.store()
	if err := preload(ctx, e, guard.New(s, guard.Options{TTL: e.opts.TTL})); err != nil {
		return nil, err
	}
	keys := int64(e.opts.Keys)
	return func(ctx context.Context, i int64) error {
		out, err := s.Claim(ctx, e.claimRequest(i%keys))
		if err == nil && out.Status != guard.Replay {
			err = fmt.Errorf("completed key %d: %s", i%keys, out.Status)
		}
		return err
	}, nil
}

// preload completes e.opts.Keys keys through g, concurrently.
func preload(ctx context.Context, e *env, g *guard.Guard) error {
	res := e.result()
	fn := func(context.Context, guard.Lease) ([]byte, error) { return res, nil }
	_, _, _, err := drive(ctx, min(e.opts.Concurrency, 64), int64(e.opts.Keys), 0, func(ctx context.Context, i int64) error {
		_, err := g.Do(ctx, guard.Key{Scope: scope, ID: idOf(i)}, "fp", fn)
		return err
	})
	return err
}

func prepareReplay(o guard.RedisOptions) func(context.Context, *env) (op, error) {
	return func(ctx context.Context, e *env) (op, error) {
		g := e.guardWith(o)
		if err := preload(ctx, e, g); err != nil {
			return nil, err
		}
		keys := int64(e.opts.Keys)
		fn := func(context.Context, guard.Lease) ([]byte, error) {
			e.effects.Add(1)
			return nil, nil
		}
		return func(ctx context.Context, i int64) error {
			r, err := g.Do(ctx, guard.Key{Scope: scope, ID: idOf(i % keys)}, "fp", fn)
			if err == nil && !r.Replayed {
				return fmt.Errorf("completed key %d did not replay", i%keys)
			}
			return err
		}, nil
	}
}

func prepareStorm(o guard.RedisOptions) func(context.Context, *env) (op, error) {
	return func(_ context.Context, e *env) (op, error) {
		g, res := e.guardWith(o), e.result()
		return func(ctx context.Context, i int64) error {
			k := e.stormKey(i)
			r, err := g.Do(ctx, guard.Key{Scope: scope, ID: idOf(k)}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				e.effect(k)
				return res, nil
			})
			switch {
			case errors.Is(err, guard.ErrInProgress):
				e.conflicts.Add(1) // a real client retries later and gets the replay
				return nil
			case err != nil:
				return err
			case r.Replayed:
				e.replays.Add(1)
			}
			return nil
		}, nil
	}
}

func (e *env) plainKey(i int64) string { return e.prefix + "p:" + idOf(i) }

func prepareSetNXSet(auto bool) func(context.Context, *env) (op, error) {
	return func(_ context.Context, e *env) (op, error) {
		c, err := e.cmdable(auto)
		if err != nil {
			return nil, err
		}
		res, lease, ttl := e.result(), 30*time.Second, e.opts.TTL
		return func(ctx context.Context, i int64) error {
			k := e.plainKey(i)
			ok, err := c.SetNX(ctx, k, "token", lease).Result()
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("fresh key %s exists", k)
			}
			return c.Set(ctx, k, res, ttl).Err()
		}, nil
	}
}

func prepareSetNXSetPipe(_ context.Context, e *env) (op, error) {
	c, res, lease, ttl := e.t.client, e.result(), 30*time.Second, e.opts.TTL
	return func(ctx context.Context, i int64) error {
		k := e.plainKey(i)
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.SetNX(ctx, k, "token", lease)
			p.Set(ctx, k, res, ttl)
			return nil
		})
		return err
	}, nil
}

// storeResults stores the row's result under name(i) for i < n, for
// Options.TTL, in pipelines of 500.
func (e *env) storeResults(ctx context.Context, n int64, name func(int64) string) error {
	res := e.result()
	for start := int64(0); start < n; start += 500 {
		_, err := e.t.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := start; i < min(start+500, n); i++ {
				p.Set(ctx, name(i), res, e.opts.TTL)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func prepareGet(auto bool) func(context.Context, *env) (op, error) {
	return func(ctx context.Context, e *env) (op, error) {
		res, keys := e.result(), int64(e.opts.Keys)
		if err := e.storeResults(ctx, keys, e.plainKey); err != nil {
			return nil, err
		}
		c, err := e.cmdable(auto)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, i int64) error {
			v, err := c.Get(ctx, e.plainKey(i%keys)).Bytes()
			if err == nil && len(v) != len(res) {
				err = fmt.Errorf("GET returned %d bytes, want %d", len(v), len(res))
			}
			return err
		}, nil
	}
}

func prepareNaiveStorm(auto bool) func(context.Context, *env) (op, error) {
	return func(_ context.Context, e *env) (op, error) {
		c, err := e.cmdable(auto)
		if err != nil {
			return nil, err
		}
		res, ttl := e.result(), e.opts.TTL
		return func(ctx context.Context, i int64) error {
			k := e.stormKey(i)
			name := e.plainKey(k)
			_, err := c.Get(ctx, name).Bytes()
			switch {
			case err == nil:
				e.replays.Add(1)
				return nil
			case !errors.Is(err, redis.Nil):
				return err
			}
			e.effect(k)
			return c.Set(ctx, name, res, ttl).Err()
		}, nil
	}
}

var discardLogger = slog.New(slog.DiscardHandler)
