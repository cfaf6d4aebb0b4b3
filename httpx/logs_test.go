package httpx_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/metrics"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsRedactKeys: the middleware's log records name a key by its
// digest (the same as metrics.KeyDigest, so they correlate with the
// guard's log), never in full, error texts included; LogKeys puts the key
// back.
func TestLogsRedactKeys(t *testing.T) {
	const secret = "pay-2f9c1e77-secret-key"
	for _, logKeys := range []bool{false, true} {
		name := "redacted"
		if logKeys {
			name = "LogKeys"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var buf syncBuffer
			logger := slog.New(slog.NewJSONHandler(&buf, nil))
			k := guard.Key{Scope: "POST /o", ID: secret}
			calls := 0
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
				if calls == 1 {
					panic("boom") // logged: handler panicked
				}
				// The record vanishes mid-run: the completion is refused,
				// and logged with the guard's error (which names the key).
				e.rdb.Del(r.Context(), e.store.Name(k))
				w.WriteHeader(http.StatusCreated)
			})
			srv, c := serve(t, guarded(e, h, httpx.Options{Logger: logger, LogKeys: logKeys}))
			do(t, c, "POST", srv.URL+"/o", "a", key(secret)...)
			do(t, c, "POST", srv.URL+"/o", "a", key(secret)...)

			recs := buf.records(t)
			if len(recs) != 2 {
				t.Fatalf("%d log records, want 2:\n%s", len(recs), buf.String())
			}
			for _, r := range recs {
				if r["key"] != metrics.KeyDigest(k) {
					t.Errorf("record's key %v, want the digest %s", r["key"], metrics.KeyDigest(k))
				}
				if logKeys && (r["id"] != secret || r["scope"] != k.Scope) {
					t.Errorf("LogKeys: record %v lacks the key", r)
				}
			}
			if strings.Contains(buf.String(), secret) != logKeys {
				t.Errorf("key in the log: %v, want %v:\n%s", !logKeys, logKeys, buf.String())
			}
			if !strings.Contains(buf.String(), "lease lost") {
				t.Errorf("the refused completion's error is not logged:\n%s", buf.String())
			}
		})
	}
}
