package guard_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// batchMark marks the context a batch is sent with, so that a hook can
// tell the batch's own pipeline (which carries it) from one of the
// client's autopipeliner (which runs every command on a context of its
// own).
type batchMark struct{}

// pipelineLog is a go-redis hook that keeps, for each pipeline sent, its
// commands' keys and whether its context carried batchMark.
type pipelineLog struct {
	mu    sync.Mutex
	pipes []loggedPipe
}

type loggedPipe struct {
	marked bool
	keys   []string
}

func (h *pipelineLog) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *pipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p := loggedPipe{marked: ctx.Value(batchMark{}) != nil}
		for _, cmd := range cmds {
			var b strings.Builder
			for _, a := range cmd.Args()[1:min(len(cmd.Args()), 4)] {
				if p, ok := a.(*string); ok {
					a = *p
				}
				fmt.Fprint(&b, a, " ")
			}
			p.keys = append(p.keys, b.String())
		}
		h.mu.Lock()
		h.pipes = append(h.pipes, p)
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// A batch goes as a pipeline of its own even while more calls than
// DirectCalls are under way on the store, never through the client's
// autopipeliner: go-redis's holds each flush for the callers it last
// answered, and a batch's callers send nothing more until their effects
// have run (design.md, Pipelining). Its claims and its completions reach
// Redis on the batch's own context, in pipelines holding nothing but the
// batch's commands: on the standalone server one pipeline each; on the
// Cluster, go-redis splits them by node, and the completions go by slot.
func TestBatchesGoOnPipelinesOfTheirOwn(t *testing.T) {
	for _, on := range []string{"client", "cluster"} {
		t.Run(on, func(t *testing.T) {
			var c redis.UniversalClient = testenv.Redis(t)
			if on == "cluster" {
				c = testenv.Cluster(t)
			}
			testBatchOwnPipelines(t, c, on == "client")
		})
	}
}

func testBatchOwnPipelines(t *testing.T, c redis.UniversalClient, standalone bool) {
	var log pipelineLog
	c.AddHook(&log)
	s := guardenv.StoreOn(t, c, guard.RedisOptions{}) // scripts loaded: no EVAL after a NOSCRIPT
	for range guard.DefaultDirectCalls + 2 {
		t.Cleanup(s.Busy())
	}
	ctx := context.WithValue(t.Context(), batchMark{}, true)
	run := testenv.Prefix(t)

	const keys = 16
	reqs := make([]guard.ClaimRequest, keys)
	for i := range reqs {
		reqs[i] = guard.ClaimRequest{Key: guard.Key{Scope: "own-pipelines", ID: fmt.Sprint(run, i)},
			Token: fmt.Sprint("T", i), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	outs, errs := s.ClaimBatch(ctx, reqs)
	ws := make([]guard.Write, keys)
	for i := range reqs {
		if errs[i] != nil || outs[i].Status != guard.Acquired {
			t.Fatalf("%s: %v, %v; want it acquired", reqs[i].Key, outs[i].Status, errs[i])
		}
		ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: outs[i].Lease, Result: []byte("done"), TTL: time.Hour}
	}
	for i, err := range s.WriteBatch(ctx, ws) {
		if err != nil {
			t.Fatalf("%s: complete: %v", reqs[i].Key, err)
		}
	}

	log.mu.Lock()
	defer log.mu.Unlock()
	var names []string
	for _, r := range reqs {
		names = append(names, s.Name(r.Key))
	}
	ours := func(k string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return strings.Contains(k, n) })
	}
	var seen, claims, completions int
	for _, p := range log.pipes {
		if !slices.ContainsFunc(p.keys, ours) {
			continue // a new connection's handshake
		}
		seen++
		if !p.marked {
			t.Fatalf("a pipeline holding the batch's commands ran on another context than the batch's (the autopipeliner's): %q", p.keys)
		}
		for _, k := range p.keys {
			if !ours(k) {
				t.Fatalf("the batch's pipeline holds a command of another call: %q in %q", k, p.keys)
			}
		}
		switch len(p.keys) {
		case keys:
			claims++
		case 1:
			completions++
		}
	}
	if seen == 0 {
		t.Fatal("no pipeline held the batch's commands")
	}
	if standalone && (claims != 1 || completions != 1 || seen != 2) {
		t.Fatalf("%d pipelines of the batch's %d claims and %d of its one completion script (%d in all); want one each: %+v",
			claims, keys, completions, seen, log.pipes)
	}
}
