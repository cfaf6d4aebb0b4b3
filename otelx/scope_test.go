package otelx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/otelx"
)

// TestScopeStaysOutWithoutRecordScope: without Options.RecordScope no span,
// attribute, event or status carries the key's scope (the tenant), not
// even in error texts that name the key: a corrupt record's claim, an
// effect's error naming its key, an exhausted key's event, a batch's
// claim. With RecordScope the texts keep it, the id still hidden.
func TestScopeStaysOutWithoutRecordScope(t *testing.T) {
	const tenant = "tenant-ACME-SECRET"
	for _, record := range []bool{false, true} {
		t.Run(fmt.Sprint("RecordScope=", record), func(t *testing.T) {
			tt := newTraced(t, otelx.Options{RecordScope: record})
			st := redisStore(t)
			g := guard.New(tt.tr.Store(st), guard.Options{Observer: tt.tr, MaxAttempts: 1})
			ctx, req := tt.tp.Tracer("test").Start(context.Background(), "request")
			scope := tenant + " POST /charges"
			key := guard.Key{Scope: scope, ID: secretID}
			declined := tt.tr.Func(func(ctx context.Context, l guard.Lease) ([]byte, error) {
				return nil, fmt.Errorf("card declined for %s", l.Key)
			})
			if _, err := g.Do(ctx, key, "fp", declined); err == nil {
				t.Fatal("declined effect: no error")
			}
			if _, err := g.Do(ctx, key, "fp", declined); !errors.Is(err, guard.ErrExhausted) {
				t.Fatalf("second attempt: %v, want ErrExhausted", err)
			}
			bad := guard.Key{Scope: scope, ID: secretID + "-corrupt"}
			if err := testenv.Redis(t).Set(ctx, st.Name(bad), "not a record", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := g.Do(ctx, bad, "fp", declined); !errors.Is(err, guard.ErrCorrupt) {
				t.Fatalf("corrupt record: %v, want ErrCorrupt", err)
			}
			rs := g.DoBatch(ctx, []guard.BatchItem{{Key: bad, Fingerprint: "fp"}}, func(context.Context, int, guard.Lease) ([]byte, error) {
				return nil, nil
			}, guard.BatchOptions{})
			if !errors.Is(rs[0].Err, guard.ErrCorrupt) {
				t.Fatalf("corrupt record in a batch: %v, want ErrCorrupt", rs[0].Err)
			}
			req.End()
			tt.noRawKey(t)
			var texts []string // every error text recorded
			for _, s := range tt.rec.Ended() {
				if s.Status().Description != "" {
					texts = append(texts, s.Status().Description)
				}
				for _, e := range s.Events() {
					for _, kv := range e.Attributes {
						if kv.Key == "exception.message" || kv.Key == "idemguard.error" {
							texts = append(texts, kv.Value.AsString())
						}
					}
				}
			}
			if len(texts) < 4 {
				t.Fatalf("%d error texts recorded, want at least 4: %q", len(texts), texts)
			}
			named := 0
			for _, s := range texts {
				if strings.Contains(s, tenant) {
					named++
					if !record {
						t.Errorf("without RecordScope an error text carries the scope: %q", s)
					}
				}
			}
			if record && named == 0 {
				t.Errorf("with RecordScope no error text names the scope: %q", texts)
			}
		})
	}
}
