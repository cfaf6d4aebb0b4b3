package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// pipelinedStore is a store on c that sends every call through the
// client's autopipeliner.
func pipelinedStore(t *testing.T, c redis.UniversalClient) *guard.RedisStore {
	t.Helper()
	return guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t), DirectCalls: -1})
}

func TestContractRedisPipelined(t *testing.T) {
	runContract(t, testenv.Redis(t), guard.RedisOptions{DirectCalls: -1})
}

func TestContractRedisClusterPipelined(t *testing.T) {
	runContract(t, testenv.Cluster(t), guard.RedisOptions{DirectCalls: -1})
}

// batchCounter is a go-redis hook that counts the guard's calls (claims,
// which are SET NX GET, and scripts) sent alone and those sent in
// pipelines, and the most calls in one pipeline.
type batchCounter struct {
	alone, piped, largest atomic.Int64
}

func (h *batchCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *batchCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.alone.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *batchCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, cmd := range cmds {
			if isScript(cmd) {
				n++
			}
		}
		h.piped.Add(n)
		for old := h.largest.Load(); n > old && !h.largest.CompareAndSwap(old, n); old = h.largest.Load() {
		}
		return next(ctx, cmds)
	}
}

// isScript reports whether cmd is one of the guard's calls: a script, or
// the SET NX GET of a claim.
func isScript(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval" || n == "set"
}

// storm runs Guard.Do on keys × dups calls at once, each key's copies
// together, and returns the effects per key. A copy that finds its key in
// progress is done: the copy holding the key completes it.
func storm(t *testing.T, g *guard.Guard, keys, dups int) []int32 {
	t.Helper()
	effects := make([]int32, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, keys*dups)
	for k := range keys {
		for range dups {
			wg.Go(func() {
				<-start
				key := guard.Key{Scope: "storm", ID: fmt.Sprint(k)}
				_, err := g.Do(context.Background(), key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
					atomic.AddInt32(&effects[k], 1)
					return []byte("done"), nil
				})
				if err != nil && !errors.Is(err, guard.ErrInProgress) {
					errs <- err // in progress: the copy holding the key answers for it
				}
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return effects
}

func TestPipelinedCallsShareRoundTrips(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client()
	var hook batchCounter
	c.AddHook(&hook)
	g := guard.New(pipelinedStore(t, c), guard.Options{})

	const keys, dups = 100, 4
	for k, n := range storm(t, g, keys, dups) {
		if n != 1 {
			t.Errorf("key %d: %d effects, want 1", k, n)
		}
	}
	// The calls went out together: most in pipelines (the autopipeliner
	// sends a batch of one as a plain command), some pipelines holding
	// several calls. The first EVALSHA of each script found none loaded
	// and was followed by an EVAL.
	alone, piped := hook.alone.Load(), hook.piped.Load()
	if alone+piped < keys*dups+keys {
		t.Errorf("%d scripts sent, want at least %d (a claim per call, a complete per key)", alone+piped, keys*dups+keys)
	}
	if piped <= alone {
		t.Errorf("%d scripts pipelined, %d sent alone: want most pipelined", piped, alone)
	}
	if n := hook.largest.Load(); n < 2 {
		t.Errorf("largest pipeline held %d scripts: %d concurrent calls shared none", n, keys*dups)
	}
}

func TestUnpipelinedStoreSendsScriptsAlone(t *testing.T) {
	c := testenv.Redis(t)
	var hook batchCounter
	c.AddHook(&hook)
	s := guardenv.StoreOn(t, c, guard.RedisOptions{Unpipelined: true, DirectCalls: -1})
	for k, n := range storm(t, guard.New(s, guard.Options{}), 50, 4) {
		if n != 1 {
			t.Errorf("key %d: %d effects, want 1", k, n)
		}
	}
	if n := hook.piped.Load(); n != 0 {
		t.Errorf("%d scripts pipelined by an unpipelined store", n)
	}
	if n := hook.alone.Load(); n < 250 {
		t.Errorf("%d scripts sent, want at least 250", n)
	}
}

func TestPipelinedScriptsLoadAgainAfterFlush(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client()
	g := guard.New(pipelinedStore(t, c), guard.Options{})
	ctx := context.Background()

	first := storm(t, g, 64, 1) // no LoadScripts: every script starts as NOSCRIPT
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	again := storm(t, g, 64, 1) // completed keys, their claim script gone again: replays
	for k := range first {
		if first[k] != 1 || again[k] != 0 {
			t.Errorf("key %d: %d effects, then %d after SCRIPT FLUSH; want 1, then 0", k, first[k], again[k])
		}
	}
}

func TestPipelinedCallEndsWithItsContext(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client() // ContextTimeoutEnabled off: the socket waits out ReadTimeout (3s)
	s := pipelinedStore(t, c)
	ctx := context.Background()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "paused"}

	const pause = 2 * time.Second
	if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := s.Claim(cctx, guard.ClaimRequest{Key: key, Token: "t1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute})
	took := time.Since(began)
	if !errors.Is(err, guard.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim on a paused server: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if took >= pause {
		t.Errorf("claim returned after %v, the whole pause: it did not end with its context", took)
	}

	// The claim was sent: once the pause ends it runs, with no one to
	// hear the answer. Its outcome was unknown; the key is pending under
	// its token, and the next claim waits for the lease as it should.
	if err := c.Ping(ctx).Err(); err != nil { // answered once the pause is over
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, key)
	switch {
	case errors.Is(err, guard.ErrNotFound):
		// The autopipeliner gave up on it before sending: nothing ran.
	case err != nil:
		t.Fatal(err)
	case rec.State != guard.StatePending || rec.Token != "t1":
		t.Fatalf("after the pause: %+v, want pending under t1", rec)
	}
}
