package guard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// movedCluster is a client of the Cluster that believes every slot is on
// the first master: each command for a key of another node is answered
// MOVED and follows the redirection. The test fails unless the first
// master answered MOVED meanwhile (its INFO errorstats).
func movedCluster(t *testing.T) *redis.ClusterClient {
	addrs := testenv.List(t, testenv.EnvCluster)
	first := redis.NewClient(&redis.Options{Addr: addrs[0]})
	movedSoFar := func() int64 {
		info, err := first.Info(bg, "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(info, "errorstat_MOVED:count=")
		n, _ := strconv.ParseInt(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
		return n
	}
	before := movedSoFar()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addrs[0]}}}}, nil
		}})
	t.Cleanup(func() {
		if !t.Failed() && movedSoFar() == before {
			t.Error("no command was redirected (MOVED)")
		}
		_ = c.Close()
		_ = first.Close()
	})
	return c
}

// ClaimBatch gives every key of a batch the answer Claim gives a twin key
// in the same state, whatever else the batch holds: invalid requests
// between the others, a key named twice, keys on every node of a Cluster,
// a batch of more than 16 commands and one of fewer, keys the native SET NX GET
// answers beside keys that need the claim script, long keys, long raw
// tokens, digested fingerprints, records with steps, a key of another type
// and a corrupt record. And the leases it hands out name their own
// records: a step saved and a completion written with one land in its
// key's record. On the standalone server, the Cluster (also with every
// command redirected) and a server without the scripts.
func TestClaimBatchAnswersAsClaim(t *testing.T) {
	for _, on := range []string{"client", "cluster", "cluster-moved", "scripts-flushed"} {
		t.Run(on, func(t *testing.T) {
			var c redis.UniversalClient
			before := func() {}
			switch on {
			case "client":
				c = testenv.Redis(t)
			case "cluster":
				c = testenv.Cluster(t)
			case "cluster-moved":
				c = movedCluster(t)
			default:
				// A server of the test's own, whose scripts are flushed
				// before each batch: the claim scripts go by EVALSHA,
				// NOSCRIPT, then EVAL.
				c = testenv.StartRedis(t).Client()
				before = func() {
					if err := c.ScriptFlush(bg).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			s := guardenv.StoreOn(t, c, guard.RedisOptions{})
			cases := claimStates(t, s, c)
			t.Run("large", func(t *testing.T) { testClaimBatchAnswersAsClaim(t, s, cases, 2, before) })
			t.Run("small", func(t *testing.T) { testClaimBatchAnswersAsClaim(t, s, cases[:5], 1, before) })
		})
	}
}

// claimState puts a key in a state (setup) and says what claim is sent
// to it then (req).
type claimState struct {
	name  string
	key   func(id string) guard.Key
	setup func(k guard.Key)
	req   func(k guard.Key, tok string) guard.ClaimRequest
	// expires: setup leaves a lease that must run out before the claim.
	expires bool
}

func claimStates(t *testing.T, s *guard.RedisStore, c redis.UniversalClient) []claimState {
	short := func(id string) guard.Key { return guard.Key{Scope: "claimbatch-as-claim", ID: id} }
	long := func(id string) guard.Key {
		return guard.Key{Scope: strings.Repeat("s", guard.MaxScopeLen), ID: (id + strings.Repeat("i", guard.MaxIDLen))[:guard.MaxIDLen]}
	}
	longTok := strings.Repeat("~", 239) // raw, the longest a record keeps
	longFP := strings.Repeat("f", 700)  // digested, hashed off the stack
	req := func(k guard.Key, tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	longReq := func(k guard.Key, tok string) guard.ClaimRequest {
		r := req(k, longTok[:len(longTok)-len(tok)]+tok)
		r.Fingerprint = longFP
		return r
	}
	once := func(k guard.Key, tok string) guard.ClaimRequest { r := req(k, tok); r.MaxAttempts = 1; return r }
	claim := func(r guard.ClaimRequest) guard.Lease {
		t.Helper()
		out, err := s.Claim(bg, r)
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s: %+v, %v", r.Key, out, err)
		}
		return out.Lease
	}
	shortLease := func(r guard.ClaimRequest) guard.ClaimRequest { r.Lease = 50 * time.Millisecond; return r }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	none := func(guard.Key) {}
	return []claimState{
		{name: "fresh", key: short, setup: none, req: req},
		{name: "replay", key: short, setup: func(k guard.Key) {
			must(s.Complete(bg, claim(req(k, "T0")), []byte("replayed"), time.Hour))
		}, req: req},
		{name: "in-progress", key: short, setup: func(k guard.Key) { claim(req(k, "T0")) }, req: req},
		{name: "failed", key: short, setup: func(k guard.Key) {
			must(s.Fail(bg, claim(req(k, "T0")), "boom", time.Hour))
		}, req: req},
		{name: "long-fresh", key: long, setup: none, req: longReq},
		{name: "mismatch", key: short, setup: func(k guard.Key) {
			must(s.Complete(bg, claim(req(k, "T0")), []byte("r"), time.Hour))
		}, req: func(k guard.Key, tok string) guard.ClaimRequest { r := req(k, tok); r.Fingerprint = "other"; return r }},
		{name: "sent-again", key: short, setup: func(k guard.Key) { claim(req(k, "again-"+k.ID)) },
			req: func(k guard.Key, _ string) guard.ClaimRequest { return req(k, "again-"+k.ID) }},
		{name: "exhausted", key: short, setup: func(k guard.Key) {
			must(s.Fail(bg, claim(once(k, "T0")), "boom", time.Hour))
		}, req: once},
		{name: "released", key: short, setup: func(k guard.Key) { must(s.Release(bg, claim(req(k, "T0")))) }, req: req},
		{name: "recovered", key: short, setup: func(k guard.Key) { claim(shortLease(req(k, "T0"))) }, req: req, expires: true},
		{name: "recovered-steps", key: short, setup: func(k guard.Key) {
			l := claim(shortLease(req(k, "T0")))
			must(s.SaveStep(bg, l, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}))
			must(s.SaveStep(bg, l, 1, guard.StepResult{Name: "mail", Result: []byte(strings.Repeat("m", 300))}))
		}, req: req, expires: true},
		{name: "long-failed-steps", key: long, setup: func(k guard.Key) {
			l := claim(longReq(k, "T0"))
			must(s.SaveStep(bg, l, 0, guard.StepResult{Name: "charge", Result: []byte("ch")}))
			must(s.Fail(bg, l, strings.Repeat("e", 200), time.Hour))
		}, req: longReq},
		{name: "long-replay", key: long, setup: func(k guard.Key) {
			must(s.Complete(bg, claim(longReq(k, "T0")), []byte("replayed"), time.Hour))
		}, req: longReq},
		{name: "long-mismatch", key: long, setup: func(k guard.Key) {
			must(s.Complete(bg, claim(longReq(k, "T0")), []byte("replayed"), time.Hour))
		}, req: func(k guard.Key, tok string) guard.ClaimRequest { r := longReq(k, tok); r.Fingerprint += "x"; return r }},
		{name: "other-type", key: short, setup: func(k guard.Key) { must(c.HSet(bg, s.Name(k), "f", "v").Err()) }, req: req},
		{name: "corrupt", key: short, setup: func(k guard.Key) { must(c.Set(bg, s.Name(k), "not a record", time.Hour).Err()) }, req: req},
	}
}

func testClaimBatchAnswersAsClaim(t *testing.T, s *guard.RedisStore, cases []claimState, copies int, before func()) {
	run := testenv.Prefix(t) // fresh keys for each run
	id := func(tc claimState, twin string) string { return run + tc.name + "/" + twin }
	// The requests of the batch: each case's copies, invalid requests
	// first, between and last, and one key named twice.
	var (
		reqs  []guard.ClaimRequest
		which []int // the case of reqs[i], or -1
	)
	invalid := func() {
		reqs = append(reqs, guard.ClaimRequest{Key: guard.Key{Scope: "x"}, Token: "TI", Lease: time.Minute, TTL: time.Hour})
		which = append(which, -1)
	}
	invalid()
	for n := range copies {
		for ci, tc := range cases {
			k := tc.key(id(tc, fmt.Sprint("b", n)))
			tc.setup(k)
			reqs = append(reqs, tc.req(k, fmt.Sprint("TB", n)))
			which = append(which, ci)
			if ci == len(cases)/2 {
				invalid()
			}
		}
	}
	invalid()
	dup := guard.Key{Scope: "claimbatch-as-claim", ID: run + "dup/b"}
	reqs = append(reqs, guard.ClaimRequest{Key: dup, Token: "D1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	reqs = append(reqs, guard.ClaimRequest{Key: dup, Token: "D2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	which = append(which, -2, -3)
	singles := make([]guard.ClaimRequest, len(cases))
	for ci, tc := range cases {
		k := tc.key(id(tc, "single"))
		tc.setup(k)
		singles[ci] = tc.req(k, "TS")
	}
	if slices.ContainsFunc(cases, func(tc claimState) bool { return tc.expires }) {
		// The probe's lease runs out after every lease set up above.
		probe := guard.ClaimRequest{Key: guard.Key{Scope: "claimbatch-as-claim", ID: run + "probe"}, Token: "P", Lease: 50 * time.Millisecond, TTL: time.Hour}
		if _, err := s.Claim(bg, probe); err != nil {
			t.Fatal(err)
		}
		probe.Token = "P2"
		testenv.WaitFor(t, 10*time.Second, "the short leases to run out", func() bool {
			out, err := s.Claim(bg, probe)
			return err == nil && out.Status == guard.Acquired
		})
	}
	want := make([]guard.Outcome, len(cases))
	wantErr := make([]error, len(cases))
	for ci := range cases {
		want[ci], wantErr[ci] = s.Claim(bg, singles[ci])
	}
	d1, e1 := s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: dup.Scope, ID: run + "dup/single"}, Token: "D1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	d2, e2 := s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: dup.Scope, ID: run + "dup/single"}, Token: "D2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})

	var outs []guard.Outcome
	var errs []error
	before()
	outs, errs = s.ClaimBatch(bg, reqs)
	if len(outs) != len(reqs) || len(errs) != len(reqs) {
		t.Fatalf("%d requests, %d outcomes, %d errors", len(reqs), len(outs), len(errs))
	}
	for i, r := range reqs {
		var name string
		var w guard.Outcome
		var werr error
		switch ci := which[i]; ci {
		case -1:
			if !errors.Is(errs[i], guard.ErrInvalidKey) {
				t.Errorf("request %d, an invalid key: %+v, %v; want ErrInvalidKey", i, outs[i], errs[i])
			}
			continue
		case -2, -3:
			name, w, werr = "dup", d1, e1
			if ci == -3 {
				w, werr = d2, e2
			}
		default:
			name, w, werr = cases[ci].name, want[ci], wantErr[ci]
		}
		if d := outcomeDiff(r, outs[i], errs[i], w, werr); d != "" {
			t.Errorf("%s (request %d): %s", name, i, d)
		}
	}

	// The batch's leases name their own records: a step and a completion
	// land in their key's record, which then replays the completion.
	for i, o := range outs {
		if errs[i] != nil || o.Status != guard.Acquired {
			continue
		}
		l, k := o.Lease, reqs[i].Key
		if i%2 == 0 { // completed as claimed: from the pending record the lease knows
			if err := s.Complete(bg, l, []byte("done "+k.ID), time.Hour); err != nil {
				t.Errorf("request %d (%s): complete: %v", i, k.ID, err)
				continue
			}
			if rec, err := s.Get(bg, k); err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "done "+k.ID ||
				rec.Token != l.Token || rec.Fence != l.Fence || len(rec.Steps) != 0 {
				t.Errorf("request %d (%s): record after its completion: %s, %v", i, k.ID, brief(rec), err)
			}
			continue
		}
		if err := s.SaveStep(bg, l, len(o.Steps), guard.StepResult{Name: "after", Result: []byte(k.ID)}); err != nil {
			t.Errorf("request %d (%s): save a step: %v", i, k.ID, err)
			continue
		}
		rec, err := s.Get(bg, k)
		if err != nil || rec.State != guard.StatePending || rec.Token != l.Token ||
			len(rec.Steps) != len(o.Steps)+1 || rec.Steps[len(o.Steps)].Name != "after" || string(rec.Steps[len(o.Steps)].Result) != k.ID {
			t.Errorf("request %d (%s): record after a step: %s, %v", i, k.ID, brief(rec), err)
		}
		if err := s.Complete(bg, l, []byte("done "+k.ID), time.Hour); err != nil {
			t.Errorf("request %d (%s): complete: %v", i, k.ID, err)
			continue
		}
		rec, err = s.Get(bg, k)
		if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "done "+k.ID || rec.Token != l.Token {
			t.Errorf("request %d (%s): record after its completion: %s, %v", i, k.ID, brief(rec), err)
		}
	}
	for i, o := range outs {
		if errs[i] != nil || o.Status != guard.Acquired {
			continue
		}
		k := reqs[i].Key
		again := reqs[i]
		again.Token = "TA"
		if out, err := s.Claim(bg, again); err != nil || out.Status != guard.Replay || string(out.Result) != "done "+k.ID {
			t.Errorf("request %d (%s) claimed again: %+v, %v; want its completion replayed", i, k.ID, out, err)
		}
	}
}

// outcomeDiff says how a ClaimBatch answer (got, gerr) to r differs from
// the Claim answer (want, werr) to r's twin; "" when it does not.
func outcomeDiff(r guard.ClaimRequest, got guard.Outcome, gerr error, want guard.Outcome, werr error) string {
	var gc, wc *guard.CorruptError
	switch {
	case (gerr == nil) != (werr == nil), errors.As(gerr, &gc) != errors.As(werr, &wc),
		gerr != nil && strings.Contains(gerr.Error(), "WRONGTYPE") != strings.Contains(werr.Error(), "WRONGTYPE"):
		return fmt.Sprintf("ClaimBatch's error %v, Claim's %v", gerr, werr)
	case gerr != nil:
		return ""
	}
	steps := func(o guard.Outcome) string {
		var b strings.Builder
		for _, st := range o.Steps {
			fmt.Fprintf(&b, "%s=%q;", st.Name, st.Result)
		}
		return b.String()
	}
	g, w := got.Lease, want.Lease
	if got.Status != want.Status || string(got.Result) != string(want.Result) || got.Attempts != want.Attempts ||
		got.LastError != want.LastError || (got.LeaseLeft > 0) != (want.LeaseLeft > 0) || steps(got) != steps(want) ||
		g.Fence != w.Fence || g.Attempt != w.Attempt || g.Recovered != w.Recovered {
		return fmt.Sprintf("ClaimBatch's %s, Claim's %s", briefOutcome(got), briefOutcome(want))
	}
	if got.Status == guard.Acquired && (g.Key != r.Key || g.Token != r.Token) {
		return fmt.Sprintf("lease of %s with token %q, want %s and %q", g.Key, g.Token, r.Key, r.Token)
	}
	return ""
}

func briefOutcome(o guard.Outcome) string {
	l := o.Lease
	return fmt.Sprintf("{%v fence %d attempt %d recovered %v result %q attempts %d last %.20q left>0 %v steps %d}",
		o.Status, l.Fence, l.Attempt, l.Recovered, o.Result, o.Attempts, o.LastError, o.LeaseLeft > 0, len(o.Steps))
}

func brief(r guard.Record) string {
	return fmt.Sprintf("{%v token %.20q fence %d result %.40q steps %d}", r.State, r.Token, r.Fence, r.Result, len(r.Steps))
}

// Concurrent batches on one store, each on its pipelines (on a Cluster,
// per node), beside one another on the client's connections: each key
// gets its own reply, its lease names its own record, and its record
// holds its own token, whatever the other batches sent meanwhile.
func TestClaimBatchConcurrentBatchesOwnReplies(t *testing.T) {
	for _, on := range []string{"client", "cluster"} {
		t.Run(on, func(t *testing.T) {
			var c redis.UniversalClient = testenv.Redis(t)
			if on == "cluster" {
				c = testenv.Cluster(t)
			}
			s := guardenv.StoreOn(t, c, guard.RedisOptions{})
			run := testenv.Prefix(t)
			const batches, keys = 6, 20
			outs := make([][]guard.Outcome, batches)
			errs := make([][]error, batches)
			reqs := make([][]guard.ClaimRequest, batches)
			for b := range batches {
				for k := range keys {
					id := fmt.Sprintf("%s%d/%d", run, b, k)
					reqs[b] = append(reqs[b], guard.ClaimRequest{Key: guard.Key{Scope: "concurrent-batches", ID: id},
						Token: fmt.Sprintf("T%d-%d", b, k), Fingerprint: fmt.Sprintf("f%d-%d", b, k), Lease: time.Minute, TTL: time.Hour})
				}
			}
			var wg sync.WaitGroup
			for b := range batches {
				wg.Go(func() { outs[b], errs[b] = s.ClaimBatch(bg, reqs[b]) })
			}
			wg.Wait()
			for b := range batches {
				for k, r := range reqs[b] {
					o, err := outs[b][k], errs[b][k]
					if err != nil || o.Status != guard.Acquired || o.Lease.Key != r.Key || o.Lease.Token != r.Token {
						t.Fatalf("%s: %s, %v; want it acquired with its own lease", r.Key, briefOutcome(o), err)
					}
					if err := s.Complete(bg, o.Lease, []byte(r.Token), time.Hour); err != nil {
						t.Fatalf("%s: complete: %v", r.Key, err)
					}
					if rec, err := s.Get(bg, r.Key); err != nil || rec.Token != r.Token || string(rec.Result) != r.Token || rec.Fingerprint != r.Fingerprint {
						t.Fatalf("%s: record %s, %v", r.Key, brief(rec), err)
					}
				}
			}
		})
	}
}
