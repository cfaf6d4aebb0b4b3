package guard_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
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

// TestScanRecordsPipelined: ScanRecords reads the records a SCAN page
// names in pipelines, not one round trip each: 300 records on a server
// of the test's own take a few SCAN calls and five pipelines (before,
// 300 reads: `idemguard list` over 120,000 records took 20-32 s).
func TestScanRecordsPipelined(t *testing.T) {
	ctx := context.Background()
	client := testenv.StartRedis(t).Client()
	s := guard.NewRedisStore(client, guard.RedisOptions{})
	const n = 300
	for i := range n {
		key := guard.Key{Scope: "scan", ID: "k" + strconv.Itoa(i)}
		req := guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := s.Complete(ctx, guard.Lease{Key: key, Token: "T"}, []byte("r"+strconv.Itoa(i)), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	trips := testenv.CountTrips(client)
	completed, pending := 0, 0
	err := s.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
		switch {
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case rec.State == guard.StateCompleted && strings.HasPrefix(string(rec.Result), "r"):
			completed++
		case rec.State == guard.StatePending:
			pending++
		default:
			t.Errorf("%s: %+v", name, rec)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if completed != n/2 || pending != n/2 {
		t.Fatalf("scanned %d completed and %d pending records, want %d of each", completed, pending, n/2)
	}
	if got, most := trips.Load(), int64(4+(n+63)/64); got > most {
		t.Fatalf("ScanRecords over %d records took %d round trips, want at most %d", n, got, most)
	}
}
