package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/scripts"
)

// scriptCounter is a hook that counts the runs of two scripts a client
// sends (by EVALSHA or EVAL, flagged or plain) and the keys of each run.
type scriptCounter struct {
	mu          sync.Mutex
	batch, each int   // runs of CompleteBatch, of Complete
	batchKeys   []int // the keys of each CompleteBatch run
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd)
		return err
	}
}

func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.count(c)
		}
		return err
	}
}

// count counts cmd once it ran: not a script the server did not have
// (NOSCRIPT) or refused to compile (a flag line on miniredis).
func (h *scriptCounter) count(cmd redis.Cmder) {
	args := cmd.Args()
	if err := cmd.Err(); len(args) < 3 || err != nil && (strings.HasPrefix(err.Error(), "NOSCRIPT") || strings.Contains(err.Error(), "Error compiling")) {
		return
	}
	is := func(sc *redis.Script) bool {
		for _, v := range []*redis.Script{sc, scripts.Plain(sc)} {
			if (cmd.Name() == "evalsha" && str(args[1]) == v.Hash()) ||
				(cmd.Name() == "eval" && str(args[1]) == scripts.Source(v)) {
				return true
			}
		}
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case is(scripts.CompleteBatch):
		h.batch++
		h.batchKeys = append(h.batchKeys, int(toInt(args[2])))
	case is(scripts.Complete):
		h.each++
	}
}

func (h *scriptCounter) reset() (batch, each int, keys []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	batch, each, keys = h.batch, h.each, h.batchKeys
	h.batch, h.each, h.batchKeys = 0, 0, nil
	return
}

// str is a string argument, passed as it is or by pointer.
func str(v any) string {
	if p, ok := v.(*string); ok {
		return *p
	}
	return fmt.Sprint(v)
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int64:
		return n
	}
	var n int64
	_, _ = fmt.Sscan(fmt.Sprint(v), &n)
	return n
}

// WriteBatch completes the keys whose record is still the pending record
// their claim wrote with one CompleteBatch run, and gives every other
// completion (completed already, released, a step recorded since, taken
// over by another holder, an unreadable value, a key of another type, a
// lease built by hand)
// exactly the answer and the record Complete gives a twin key in the same
// state, through complete.lua. On Redis with the scripts loaded, and on
// miniredis without them (NOSCRIPT, then the flag line refused).
func TestWriteBatchCompleteBatch(t *testing.T) {
	for _, name := range []string{"redis", "miniredis"} {
		t.Run(name, func(t *testing.T) {
			var (
				c  *redis.Client
				s  *guard.RedisStore
				mr *miniredis.Miniredis
			)
			h := &scriptCounter{}
			if name == "redis" {
				c = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
				c.AddHook(h)
				s = guardenv.StoreOn(t, c, guard.RedisOptions{})
			} else {
				mr = miniredis.RunT(t)
				c = redis.NewClient(&redis.Options{Addr: mr.Addr()})
				c.AddHook(h)
				s = guard.NewRedisStore(c, guard.RedisOptions{})
			}
			t.Cleanup(func() { _ = c.Close() })
			testWriteBatchCompleteBatch(t, c, s, h, mr)
		})
	}
}

func testWriteBatchCompleteBatch(t *testing.T, c *redis.Client, s *guard.RedisStore, h *scriptCounter, mr *miniredis.Miniredis) {
	key := func(id string) guard.Key { return guard.Key{Scope: "completebatch", ID: id} }
	claim := func(id, token string, lease time.Duration) guard.Lease {
		t.Helper()
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key(id), Token: token, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s: %+v, %v", id, out, err)
		}
		return out.Lease
	}
	// Each case puts a key in its state and returns the lease its
	// holder completes with.
	cases := []struct {
		name  string
		setup func(id string) guard.Lease
		fast  bool // on CompleteBatch's fast path
	}{
		{"fresh", func(id string) guard.Lease { return claim(id, "T", time.Minute) }, true},
		{"fresh2", func(id string) guard.Lease { return claim(id, "T", time.Minute) }, true},
		{"completed", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			if err := s.Complete(bg, l, []byte("first"), time.Hour); err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
		{"released", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			if err := s.Release(bg, l); err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
		{"stepped", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			if err := s.SaveStep(bg, l, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
		{"taken-over", func(id string) guard.Lease {
			l := claim(id, "A", 50*time.Millisecond)
			if mr != nil {
				mr.FastForward(time.Second)
			}
			testenv.WaitFor(t, 10*time.Second, "the lease to run out", func() bool {
				out, err := s.Claim(bg, guard.ClaimRequest{Key: key(id), Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
				return err == nil && out.Status == guard.Acquired
			})
			return l
		}, false},
		{"corrupt", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			if err := c.Set(bg, s.Name(key(id)), "not a record", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
		{"other-type", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			n := s.Name(key(id))
			if err := c.Del(bg, n).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.HSet(bg, n, "f", "v").Err(); err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
		{"by-hand", func(id string) guard.Lease {
			l := claim(id, "T", time.Minute)
			return guard.Lease{Key: l.Key, Token: l.Token}
		}, false},
	}
	ws := make([]guard.Write, len(cases))
	single := make([]error, len(cases))
	for i, tc := range cases {
		ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: tc.setup(tc.name + "/batch"), Result: []byte("second"), TTL: time.Hour}
		single[i] = s.Complete(bg, tc.setup(tc.name+"/single"), []byte("second"), time.Hour)
	}
	h.reset()
	errs := s.WriteBatch(bg, ws)
	batch, each, keys := h.reset()
	fast := 0
	for i, tc := range cases {
		if tc.fast {
			fast++
		}
		got, want := errs[i], single[i]
		var gc, wc *guard.CorruptError
		switch {
		case (got == nil) != (want == nil),
			errors.Is(want, guard.ErrLeaseLost) != errors.Is(got, guard.ErrLeaseLost),
			errors.As(want, &wc) != errors.As(got, &gc):
			t.Errorf("%s: WriteBatch's answer %v, Complete's %v", tc.name, got, want)
		}
		if tc.name == "corrupt" && gc == nil {
			t.Errorf("corrupt: WriteBatch's answer %v, want a *CorruptError", got)
		}
		if tc.name == "released" && !errors.Is(got, guard.ErrLeaseLost) || tc.name == "taken-over" && !errors.Is(got, guard.ErrLeaseLost) {
			t.Errorf("%s: WriteBatch's answer %v, want ErrLeaseLost", tc.name, got)
		}
		if tc.name == "corrupt" {
			continue
		}
		rb, eb := s.Get(bg, key(tc.name+"/batch"))
		rs, es := s.Get(bg, key(tc.name+"/single"))
		if (eb == nil) != (es == nil) || rb.State != rs.State || string(rb.Result) != string(rs.Result) || rb.Token != rs.Token || len(rb.Steps) != len(rs.Steps) {
			t.Errorf("%s: record after WriteBatch %+v, %v; after Complete %+v, %v", tc.name, rb, eb, rs, es)
		}
	}
	if batch != 1 || len(keys) != 1 || keys[0] != len(cases)-1 {
		t.Errorf("CompleteBatch ran %d times over %v keys, want once over the %d keys whose lease knows its pending record", batch, keys, len(cases)-1)
	}
	if want := len(cases) - fast; each != want {
		t.Errorf("complete.lua ran %d times, want %d (once per key off the fast path)", each, want)
	}
	// The same batch again (a client's retry) gets the same answers.
	again := s.WriteBatch(bg, ws)
	for i := range ws {
		if (again[i] == nil) != (errs[i] == nil) || errors.Is(again[i], guard.ErrLeaseLost) != errors.Is(errs[i], guard.ErrLeaseLost) {
			t.Errorf("%s: sent again, %v; first %v", cases[i].name, again[i], errs[i])
		}
	}
}

// On a Cluster, the completions of keys of one slot share a CompleteBatch
// run and a key alone in its slot gets complete.lua: every key completed.
func TestWriteBatchCompleteBatchCluster(t *testing.T) {
	c := testenv.Cluster(t)
	h := &scriptCounter{}
	c.AddHook(h)
	s := guardenv.StoreOn(t, c, guard.RedisOptions{})
	key := func(id string) guard.Key { return guard.Key{Scope: "completebatch", ID: id} }
	// Three keys of one slot, and two alone in theirs.
	slot := guard.KeySlot(s.Name(key("same0")))
	ids := []string{"same0"}
	for i := 0; len(ids) < 3; i++ {
		if id := fmt.Sprint("same", i, "x"); guard.KeySlot(s.Name(key(id))) == slot {
			ids = append(ids, id)
		}
	}
	for i := 0; len(ids) < 5; i++ {
		id := fmt.Sprint("alone", i)
		sl, ok := guard.KeySlot(s.Name(key(id))), true
		for _, o := range ids {
			ok = ok && guard.KeySlot(s.Name(key(o))) != sl
		}
		if ok {
			ids = append(ids, id)
		}
	}
	// In the batch, the slot's keys are not next to one another.
	ids[1], ids[3] = ids[3], ids[1]
	ws := make([]guard.Write, len(ids))
	for i, id := range ids {
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key(id), Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s: %+v, %v", id, out, err)
		}
		ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: out.Lease, Result: []byte(id), TTL: time.Hour}
	}
	h.reset()
	for i, err := range s.WriteBatch(bg, ws) {
		if err != nil {
			t.Errorf("%s: %v", ids[i], err)
		}
	}
	batch, each, keys := h.reset()
	if batch != 1 || keys[0] != 3 || each != 2 {
		t.Errorf("CompleteBatch ran %d times over %v keys and complete.lua %d times; want once over 3 keys, and twice", batch, keys, each)
	}
	for _, id := range ids {
		if rec, err := s.Get(bg, key(id)); err != nil || rec.State != guard.StateCompleted || string(rec.Result) != id {
			t.Errorf("%s: %+v, %v; want completed with its result", id, rec, err)
		}
	}
}

// A CompleteBatch run takes at most 64 keys: 130 completions go as runs of
// 64, 64 and 2, every key completed. A batch that names a key twice (which
// BatchStore's contract forbids) is not grouped at all: one complete.lua
// per write, in order.
func TestWriteBatchCompleteBatchBounds(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	h := &scriptCounter{}
	c.AddHook(h)
	s := guardenv.StoreOn(t, c, guard.RedisOptions{})
	key := func(id int) guard.Key { return guard.Key{Scope: "completebatch-bounds", ID: fmt.Sprint(id)} }
	claim := func(id int) guard.Write {
		t.Helper()
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key(id), Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %d: %+v, %v", id, out, err)
		}
		return guard.Write{Kind: guard.WriteComplete, Lease: out.Lease, Result: []byte(fmt.Sprint(id)), TTL: time.Hour}
	}

	ws := make([]guard.Write, 130)
	for i := range ws {
		ws[i] = claim(i)
	}
	h.reset()
	for i, err := range s.WriteBatch(bg, ws) {
		if err != nil {
			t.Errorf("key %d: %v", i, err)
		}
	}
	if batch, each, keys := h.reset(); batch != 3 || fmt.Sprint(keys) != "[64 64 2]" || each != 0 {
		t.Errorf("CompleteBatch ran %d times over %v keys and complete.lua %d times; want over [64 64 2], and never", batch, keys, each)
	}
	for i := range ws {
		if rec, err := s.Get(bg, key(i)); err != nil || rec.State != guard.StateCompleted || string(rec.Result) != fmt.Sprint(i) {
			t.Errorf("key %d: %+v, %v; want completed with its result", i, rec, err)
		}
	}

	twice := []guard.Write{claim(1000), claim(1001)}
	twice = append(twice, twice[0])
	h.reset()
	errs := s.WriteBatch(bg, twice)
	if batch, each, _ := h.reset(); batch != 0 || each != 3 {
		t.Errorf("a key named twice: CompleteBatch ran %d times and complete.lua %d; want never, and 3 times", batch, each)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d of the batch naming a key twice: %v", i, err)
		}
	}
}

// ClaimBatch reads each key's answer from that key's own command, also
// when a request it refuses (an invalid key) sends none and the commands
// after it are one place ahead of their keys: on a *redis.Client, whose
// replies it reads raw, and on a Cluster, whose it reads by go-redis.
func TestClaimBatchAnswersEachKeyItsOwnReply(t *testing.T) {
	for _, name := range []string{"client", "cluster"} {
		t.Run(name, func(t *testing.T) {
			var s *guard.RedisStore
			if name == "client" {
				s = guardenv.Store(t, guard.RedisOptions{})
			} else {
				s = guardenv.StoreOn(t, testenv.Cluster(t), guard.RedisOptions{})
			}
			key := func(id string) guard.Key { return guard.Key{Scope: "claimbatch-replies", ID: id} }
			req := func(k guard.Key, tok string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			}
			out, err := s.Claim(bg, req(key("done"), "T1"))
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim done: %+v, %v", out, err)
			}
			if err := s.Complete(bg, out.Lease, []byte("done's result"), time.Hour); err != nil {
				t.Fatal(err)
			}
			reqs := []guard.ClaimRequest{req(key(""), "T2"), req(key("fresh"), "T2"), req(key("done"), "T2"), req(key("fresh2"), "T3")}
			outs, errs := s.ClaimBatch(bg, reqs)
			if !errors.Is(errs[0], guard.ErrInvalidKey) {
				t.Errorf("empty id: %v, want ErrInvalidKey", errs[0])
			}
			for _, i := range []int{1, 3} {
				if errs[i] != nil || outs[i].Status != guard.Acquired || outs[i].Lease.Key != reqs[i].Key {
					t.Errorf("%s: %+v, %v; want it acquired", reqs[i].Key, outs[i], errs[i])
				}
			}
			if errs[2] != nil || outs[2].Status != guard.Replay || string(outs[2].Result) != "done's result" {
				t.Errorf("done: %+v, %v; want its result replayed", outs[2], errs[2])
			}
			// The leases name their own records: completing one replays it.
			for _, i := range []int{1, 3} {
				if err := s.Complete(bg, outs[i].Lease, []byte(reqs[i].Key.ID), time.Hour); err != nil {
					t.Fatalf("complete %s: %v", reqs[i].Key, err)
				}
				o, err := s.Claim(bg, req(reqs[i].Key, "T4"))
				if err != nil || o.Status != guard.Replay || string(o.Result) != reqs[i].Key.ID {
					t.Errorf("%s after its completion: %+v, %v; want %q replayed", reqs[i].Key, o, err, reqs[i].Key.ID)
				}
			}
		})
	}
}
