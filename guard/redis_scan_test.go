package guard_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestScanRecords: ScanRecords gives every record of the store and nothing
// else (not a key of a store whose prefix extends this one's, not another
// key under the prefix), a corrupt record with its error, on a standalone
// server and across the masters of a Cluster; fn returning false stops it.
func TestScanRecords(t *testing.T) {
	for name, client := range map[string]redis.UniversalClient{
		"standalone": testenv.Redis(t),
		"cluster":    testenv.Cluster(t),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			prefix := testenv.Prefix(t)
			s := guard.NewRedisStore(client, guard.RedisOptions{Prefix: prefix})
			longer := guard.NewRedisStore(client, guard.RedisOptions{Prefix: prefix + "x"})
			want := map[string]guard.State{}
			for i, st := range []guard.State{guard.StatePending, guard.StateCompleted, guard.StateFailed, guard.StateCompleted, guard.StatePending} {
				key := guard.Key{Scope: "scan", ID: string(rune('a' + i))}
				req := guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
				if out, err := s.Claim(ctx, req); err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim: %v, %v", out.Status, err)
				}
				l := guard.Lease{Key: key, Token: "T"}
				switch st {
				case guard.StateCompleted:
					if err := s.Complete(ctx, l, []byte("ok"), time.Hour); err != nil {
						t.Fatal(err)
					}
				case guard.StateFailed:
					if err := s.Fail(ctx, l, "no", time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				want[s.Name(key)] = st
				if _, err := longer.Claim(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			corrupt := s.Name(guard.Key{Scope: "scan", ID: "corrupt"})
			for k, v := range map[string]string{corrupt: "not a record", prefix + "other": "x", prefix + "{short}": "x"} {
				if err := client.Set(ctx, k, v, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}

			got := map[string]guard.State{}
			var bad []string
			err := s.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
				if err != nil {
					if !errors.Is(err, guard.ErrCorrupt) {
						t.Errorf("%s: %v, want ErrCorrupt", name, err)
					}
					bad = append(bad, name)
					return true
				}
				if _, dup := got[name]; dup {
					t.Errorf("%s given twice", name)
				}
				got[name] = rec.State
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Errorf("scanned %v, want %v", got, want)
			}
			for n, st := range want {
				if got[n] != st {
					t.Errorf("%s: %v, want %v", n, got[n], st)
				}
			}
			if !slices.Equal(bad, []string{corrupt}) {
				t.Errorf("unreadable %v, want [%s]", bad, corrupt)
			}

			calls := 0
			if err := s.ScanRecords(ctx, func(string, guard.Record, error) bool { calls++; return false }); err != nil || calls != 1 {
				t.Errorf("stopped scan: %d calls, %v; want 1, nil", calls, err)
			}
		})
	}
}
