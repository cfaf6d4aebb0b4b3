package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestOutcomeLogHidesShortKey: the README promises the gateway's
// logs name keys as digests (log.keys: true: in full). The gateway's own
// outcome lines (logOutcome) hid a key's id in their error text only when
// it was 8 bytes or longer, and never hid its "scope/id" form, which guard
// errors use: a client's 7-byte key ("k-abcde", an order number) was
// written in full. httpx's lines (adapter.LogErr) and metrics.Logger's
// hide the "scope/id" form whatever the id's length. Here the forward
// step's store call fails (lateStepStore), and the line "not forwarded;
// the forward step was stored though its store call failed" carries the
// step's error, which names the key.
func TestOutcomeLogHidesShortKey(t *testing.T) {
	u := newUpstream(t)
	cfg, prefix := config(t, basicConfig, u.URL)
	st := &lateStepStore{RedisStore: guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: prefix})}
	st.late.Store(true)
	e := startConfigured(t, cfg, func(o *Options) { o.Store = st })
	const key = "k-abcde"
	r := post(t, e.srv.URL+"/orders", key, `{"order":"short"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a forward step the store answered late: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "marked unsent") {
		t.Fatalf("no outcome line for the late step in the log:\n%s", logs)
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, key) {
			t.Errorf("log.keys false, but a log line names the key %q in full:\n%s", key, line)
		}
	}
}
