package guard_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// A completed record as a RedisStore keeps it for token "A", fingerprint
// "fp" and result "result" (record format 1, guard/record.go):
//
//	01 'c' | fence 01 | attempt 01 | fp 02 'f' 'p' | token 01 'A' |
//	ptok 00 | last error 00 | result 06 "result"
const completedHead = 11 // bytes before the result's length

// completedValue writes that record for key through s and returns its
// value, read back from Redis.
func completedValue(t *testing.T, s *guard.RedisStore, key guard.Key) []byte {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	v, err := s.Client().Get(ctx, s.Name(key)).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	want := "\x01c\x01\x01\x02fp\x01A\x00\x00\x06result"
	if string(v) != want {
		t.Fatalf("completed record %q, want %q: the format changed, update this test", v, want)
	}
	return v
}

// stringCorruption stores what edit makes of a completed record.
func stringCorruption(name string, edit func(v []byte) []byte) storetest.Corruption {
	return storetest.Corruption{Name: name, Write: func(t *testing.T, st guard.Store, key guard.Key) func() bool {
		s := st.(*guard.RedisStore)
		bad := edit(completedValue(t, s, key))
		ctx := context.Background()
		if err := s.Client().Set(ctx, s.Name(key), bad, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		return func() bool {
			v, err := s.Client().Get(ctx, s.Name(key)).Bytes()
			return err == nil && bytes.Equal(v, bad)
		}
	}}
}

func with(v []byte, i int, b ...byte) []byte {
	return append(append(bytes.Clone(v[:i]), b...), v[i+1:]...)
}

// redisCorruptions are the shapes of records a RedisStore cannot read.
var redisCorruptions = []storetest.Corruption{
	stringCorruption("UnknownVersion", func(v []byte) []byte { return with(v, 0, 2) }),
	stringCorruption("UnknownState", func(v []byte) []byte { return with(v, 1, 'x') }),
	stringCorruption("ReleasedMarkedRecovered", func(v []byte) []byte { return with(v, 1, 'R') }),
	stringCorruption("FenceZero", func(v []byte) []byte { return with(v, 2, 0) }),
	// 2^53: Lua's doubles would hand it out again as the same fence.
	stringCorruption("FenceTooLarge", func(v []byte) []byte { return with(v, 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10) }),
	stringCorruption("FenceNotMinimal", func(v []byte) []byte { return with(v, 2, 0x81, 0x00) }),
	stringCorruption("FenceNineBytes", func(v []byte) []byte {
		return with(v, 2, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01)
	}),
	stringCorruption("AttemptsZero", func(v []byte) []byte { return with(v, 3, 0) }),
	stringCorruption("FingerprintKind", func(v []byte) []byte { return with(v, 4, 17) }),
	stringCorruption("TokenEmpty", func(v []byte) []byte { return with(v, 7, 0) }),
	stringCorruption("PackedTokenNotCanonical", func(v []byte) []byte {
		return append(append(bytes.Clone(v[:7]), append([]byte{0xff, 4}, bytes.Repeat([]byte{0}, 16)...)...), v[9:]...)
	}),
	stringCorruption("CompletedWithoutResult", func(v []byte) []byte { return v[:completedHead] }),
	stringCorruption("ResultTruncated", func(v []byte) []byte { return v[:len(v)-1] }),
	stringCorruption("HeaderTruncated", func(v []byte) []byte { return v[:6] }),
	stringCorruption("TrailingBytes", func(v []byte) []byte { return append(v, 0) }),
	stringCorruption("Empty", func([]byte) []byte { return []byte{} }),
	stringCorruption("Text", func([]byte) []byte { return []byte("completed") }),
	{Name: "HashOfTheOldLayout", Write: func(t *testing.T, st guard.Store, key guard.Key) func() bool {
		s := st.(*guard.RedisStore)
		ctx := context.Background()
		old := map[string]string{"st": "c", "fp": "fp", "tok": "A", "fen": "1", "att": "1", "rcv": "0", "res": "result", "sc": key.Scope, "id": key.ID}
		if err := s.Client().HSet(ctx, s.Name(key), old).Err(); err != nil {
			t.Fatal(err)
		}
		return func() bool {
			got, err := s.Client().HGetAll(ctx, s.Name(key)).Result()
			return err == nil && len(got) == len(old) && got["res"] == "result"
		}
	}},
	{Name: "List", Write: func(t *testing.T, st guard.Store, key guard.Key) func() bool {
		s := st.(*guard.RedisStore)
		ctx := context.Background()
		if err := s.Client().RPush(ctx, s.Name(key), "x").Err(); err != nil {
			t.Fatal(err)
		}
		return func() bool { return s.Client().LLen(ctx, s.Name(key)).Val() == 1 }
	}},
}

// TestUngrowable: a readable record whose fence or attempts are at the
// largest a RedisStore keeps cannot be taken over; the claim fails with
// ErrCorrupt naming the key, and one below hands out the largest fence.
func TestUngrowable(t *testing.T) {
	for _, srv := range []struct {
		name  string
		store func(t *testing.T) *guard.RedisStore
	}{
		{"miniredis", func(t *testing.T) *guard.RedisStore { s, _ := miniStore(t); return s }},
		{"redis", func(t *testing.T) *guard.RedisStore {
			s := guardenv.Store(t, guard.RedisOptions{})
			return s
		}},
	} {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.store(t)
			// failed writes a failed record for key at fence, attempt.
			failed := func(key guard.Key, fence, attempt []byte) {
				t.Helper()
				if _, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
				if err := s.Fail(bg, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour); err != nil {
					t.Fatal(err)
				}
				v, err := s.Client().Get(bg, s.Name(key)).Bytes()
				if err != nil || len(v) < 4 || v[1] != 'f' || v[2] != 1 || v[3] != 1 {
					t.Fatalf("failed record %q, %v", v, err)
				}
				v = append(append(append([]byte{1, 'f'}, fence...), attempt...), v[4:]...)
				if err := s.Client().Set(bg, s.Name(key), v, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}
			max := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f} // 2^53-1
			below := []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f}
			claimB := func(key guard.Key) (guard.Outcome, error) {
				return s.Claim(bg, guard.ClaimRequest{Key: key, Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			}

			top := guard.Key{Scope: "s", ID: "fence-at-max"}
			failed(top, max, []byte{1})
			if rec, err := s.Get(bg, top); err != nil || rec.Fence != guard.RedisMaxFence {
				t.Fatalf("Get = %+v, %v; want fence %d", rec, err, int64(guard.RedisMaxFence))
			}
			if out, err := claimB(top); !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), top.String()) ||
				!strings.Contains(err.Error(), "fence cannot grow") || out.Status != 0 {
				t.Fatalf("claim of a record at the largest fence = %+v, %v; want ErrCorrupt naming %s", out, err, top)
			}
			if rec, _ := s.Get(bg, top); rec.State != guard.StateFailed || rec.Fence != guard.RedisMaxFence {
				t.Fatalf("the refused claim changed the record: %+v", rec)
			}

			next := guard.Key{Scope: "s", ID: "fence-below-max"}
			failed(next, below, []byte{1})
			out, err := claimB(next)
			if err != nil || out.Status != guard.Acquired || out.Lease.Fence != guard.RedisMaxFence || out.Lease.Attempt != 2 {
				t.Fatalf("claim of a record one below the largest fence = %+v, %v; want fence %d", out, err, int64(guard.RedisMaxFence))
			}

			att := guard.Key{Scope: "s", ID: "attempts-at-max"}
			failed(att, []byte{1}, max)
			if _, err := claimB(att); !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), "attempts cannot grow") {
				t.Fatalf("claim of a record at the largest attempt count = %v, want ErrCorrupt", err)
			}

			// A pending record without an expiry has no lease the server
			// can judge.
			persisted := guard.Key{Scope: "s", ID: "persisted"}
			if _, err := s.Claim(bg, guard.ClaimRequest{Key: persisted, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := s.Client().Persist(bg, s.Name(persisted)).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := claimB(persisted); !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), "without expiry") {
				t.Fatalf("claim of a pending record without expiry = %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzStoredValue: whatever bytes sit at a key's name, every call either
// reads them as a record or fails with ErrCorrupt naming the key, and a
// value the Go decoder refuses is refused by the scripts too and left as
// it was. Never a panic, a script error, a run or a silent replay.
func FuzzStoredValue(f *testing.F) {
	f.Add([]byte("\x01c\x01\x01\x02fp\x01A\x00\x00\x06result"))
	f.Add([]byte("\x01p\x01\x01\x02fp\x01A\x00\x00\x80\xdd\xdb\x01\x01s\x01k"))
	f.Add([]byte("\x01f\x02\x02\x02fp\x01B\x01A\x04boom\x01s\x01k"))
	f.Add([]byte("\x01r\x01\x01\x02fp\x01A\x00\x00"))
	f.Add([]byte("\x01F\xff\xff\xff\xff\xff\xff\xff\x0f\x02\x02fp\x01B\x00\x00\x01s\x01k"))
	f.Add([]byte("\x01c\x01\x01\x02fp\x01A\x00\x00"))
	f.Add([]byte{})
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		f.Fatal(err)
	}
	defer mr.Close()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	s := guard.NewRedisStore(c, guard.RedisOptions{})
	if err := s.LoadScripts(bg); err != nil {
		f.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "k"}
	name := s.Name(key)
	f.Fuzz(func(t *testing.T, v []byte) {
		rec, derr := guard.DecodeRecord(v)
		corrupt := errors.Is(derr, guard.ErrCorrupt)
		atMax := derr == nil && (rec.Fence == guard.RedisMaxFence || rec.Attempt == guard.RedisMaxFence)
		for _, call := range []struct {
			name string
			run  func() error
		}{
			{"Get", func() error { _, err := s.Get(bg, key); return err }},
			{"Claim", func() error {
				out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "F", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, MaxAttempts: 3})
				if err == nil && out.Status == guard.Replay && (derr != nil || rec.State != guard.StateCompleted || !bytes.Equal(out.Result, rec.Result)) {
					t.Fatalf("claim replayed %q from %q (decoded %+v, %v)", out.Result, v, rec, derr)
				}
				if err == nil && out.Status == guard.Acquired && out.Lease.Fence > 1 && derr == nil && out.Lease.Fence != rec.Fence+1 && out.Lease.Fence != rec.Fence {
					t.Fatalf("claim took fence %d from a record at %d", out.Lease.Fence, rec.Fence)
				}
				return err
			}},
			{"Complete", func() error { return s.Complete(bg, guard.Lease{Key: key, Token: "A"}, []byte("x"), time.Hour) }},
			{"Fail", func() error { return s.Fail(bg, guard.Lease{Key: key, Token: "A"}, "x", time.Hour) }},
			{"Release", func() error { return s.Release(bg, guard.Lease{Key: key, Token: "A"}) }},
			{"Extend", func() error { return s.Extend(bg, guard.Lease{Key: key, Token: "A"}, time.Minute) }},
		} {
			if err := c.Set(bg, name, v, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			err := call.run()
			switch {
			case corrupt:
				var ce *guard.CorruptError
				if !errors.As(err, &ce) || ce.Key != key || ce.Name != name {
					t.Fatalf("%s of %q = %v, want a CorruptError for %s (decoder: %v)", call.name, v, err, key, derr)
				}
				if now, _ := c.Get(bg, name).Bytes(); !bytes.Equal(now, v) {
					t.Fatalf("%s changed corrupt %q to %q", call.name, v, now)
				}
			case errors.Is(err, guard.ErrCorrupt) && call.name == "Claim" && atMax:
				// A readable record whose fence cannot grow.
			case err != nil && !errors.Is(err, guard.ErrLeaseLost) && !errors.Is(err, guard.ErrNotFound):
				t.Fatalf("%s of readable %q (%+v): %v", call.name, v, rec, err)
			}
		}
	})
}

// TestPendingWithoutExpiry: a pending record that lost its expiry (an
// operator's PERSIST, a keyspace copied or restored without its TTLs)
// never frees its key: every claim but its holder's fails with ErrCorrupt
// naming the key. Get says so too (it showed a pending record whose lease
// had run out, which `idemguard inspect` and `list` took for a key the
// next claim recovers), and its holder can still complete it.
func TestPendingWithoutExpiry(t *testing.T) {
	for _, srv := range []struct {
		name  string
		store func(t *testing.T) *guard.RedisStore
	}{
		{"miniredis", func(t *testing.T) *guard.RedisStore { s, _ := miniStore(t); return s }},
		{"redis", func(t *testing.T) *guard.RedisStore { return guardenv.Store(t, guard.RedisOptions{}) }},
	} {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.store(t)
			ctx := context.Background()
			key := guard.Key{Scope: "POST /pay", ID: "persisted"}
			if _, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := s.Client().Persist(ctx, s.Name(key)).Err(); err != nil {
				t.Fatal(err)
			}
			corrupt := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), key.String()) {
					t.Errorf("%s of a pending record without expiry = %v, want ErrCorrupt naming %s", what, err, key)
				}
			}
			_, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			corrupt("another claim", err)
			_, err = s.Get(ctx, key)
			corrupt("Get", err)
			_, err = s.GetByName(ctx, s.Name(key))
			if !errors.Is(err, guard.ErrCorrupt) {
				t.Errorf("GetByName = %v, want ErrCorrupt", err)
			}
			if err := s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("result"), time.Hour); err != nil {
				t.Fatalf("its holder's Complete: %v", err)
			}
			if rec, err := s.Get(ctx, key); err != nil || rec.State != guard.StateCompleted || rec.TTL <= 0 {
				t.Fatalf("after its holder's Complete: %+v, %v; want completed, with a retention", rec, err)
			}
		})
	}
}
