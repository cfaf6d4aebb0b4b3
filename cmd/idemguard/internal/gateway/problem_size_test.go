package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// the gateway's own final answer, the 500 upstream-outcome-unknown
// problem, is the key's stored result: README ("What it does not") says
// every retry gets it, and that its upstream_idempotency_key is what to
// reconcile by. It goes through httpx's capture like any answer, under the
// route's max_stored_response: a problem larger than that is not kept, and
// every retry gets httpx's response-not-kept problem instead, which says
// the request "ran with this status" (500) and carries no
// upstream_idempotency_key.
//
// Two ways a problem outgrows the limit:
//   - its detail quotes the transport's error, and net/http's "malformed
//     HTTP response %q" error quotes the upstream's whole first line (up
//     to 10 MiB): an upstream answering something that is not HTTP (a
//     misrouted port) makes a problem as large as its garbage, sent to
//     the client, and over the default 1 MiB not kept;
//   - a max_stored_response smaller than the problem (the configuration
//     accepts anything from 1 byte; the problem is ~500 bytes with a
//     UUID key, ~2 KiB with a 255-byte key).

// garbageUpstream answers every request with n bytes that are no HTTP
// status line, then closes the connection.
func garbageUpstream(t *testing.T, n int) *upstream {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return true
		}
		_, _ = brw.WriteString(strings.Repeat("X", n) + "\r\n\r\n")
		_ = brw.Flush()
		_ = conn.Close()
		return true
	})
	return u
}

// checkOutcomeUnknownKept sends the key twice: the first answer must be
// the outcome-unknown problem, and the retry must get that same problem,
// replayed, with its upstream_idempotency_key; the upstream runs once.
func checkOutcomeUnknownKept(t *testing.T, e *gwEnv, u *upstream, key string) {
	t.Helper()
	first := post(t, e.srv.URL+"/orders", key, `{"order":"ps1"}`, "X-Account-Id", "acme")
	if first.status != http.StatusInternalServerError || first.problemType() != ProblemOutcomeUnknown {
		t.Fatalf("first: %d %.300q; want 500 %s", first.status, first.body, ProblemOutcomeUnknown)
	}
	if len(first.body) > 16<<10 {
		t.Errorf("first: the gateway's problem is %d bytes: it quotes the upstream's answer", len(first.body))
	}
	again := post(t, e.srv.URL+"/orders", key, `{"order":"ps1"}`, "X-Account-Id", "acme")
	var p problem
	_ = json.Unmarshal([]byte(again.body), &p)
	if again.status != http.StatusInternalServerError || !again.replayed() || p.Type != ProblemOutcomeUnknown || p.UpstreamKey == "" {
		t.Fatalf("retry: %d replayed=%v %.300q\nwant the stored %s problem with its upstream_idempotency_key "+
			"(README: every retry gets it)", again.status, again.replayed(), again.body, ProblemOutcomeUnknown)
	}
	if n := u.count("ps1"); n != 1 {
		t.Fatalf("the upstream got the request %d times, want 1", n)
	}
}

// An upstream answering 1.2 MB that is not HTTP: the default
// max_stored_response (1 MiB).
func TestMalformedAnswerOutcomeUnknownKept(t *testing.T) {
	u := garbageUpstream(t, 1200000)
	e := startGateway(t, basicConfig, u.URL)
	checkOutcomeUnknownKept(t, e, u, "k-garbage")
}

// A max_stored_response smaller than the gateway's own problem: either
// the configuration is refused at start, naming the field, or the
// outcome-unknown answer is kept whole all the same.
func TestSmallStoredLimitKeepsOutcomeUnknown(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		conn, _, _ := http.NewResponseController(w).Hijack() // read it, acted, no answer
		_ = conn.Close()
		return true
	})
	text := basicConfig + "    max_stored_response: 256B\n"
	text = strings.NewReplacer("{redis}", "127.0.0.1:1", "{prefix}", "x:", "{upstream}", u.URL).Replace(text)
	if _, err := Parse("test.yaml", []byte(text)); err != nil {
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "max_stored_response") {
			t.Fatalf("refused, but not naming max_stored_response: %v", err)
		}
		return // refused at start, with the field named: the user is told
	}
	e := startGateway(t, basicConfig+"    max_stored_response: 256B\n", u.URL)
	checkOutcomeUnknownKept(t, e, u, "k-small-limit")
}

// The largest outcome-unknown problem the gateway can store fits the
// least max_stored_response the configuration accepts: a 255-byte key of
// characters JSON escapes six-fold, the transport's error as long and as
// escaped, and the longest reason (an earlier attempt's forward).
func TestLargestProblemFitsTheLeastLimit(t *testing.T) {
	lease := guard.Lease{Key: guard.Key{Scope: "s", ID: strings.Repeat("<", guard.MaxIDLen)}}
	at := time.Now()
	for _, why := range []string{
		"the connection to the upstream failed before its whole answer came: " +
			errText(errors.New("malformed HTTP response "+strings.Repeat("<", 1<<20))),
		"an earlier attempt of this key forwarded the request at " + at.UTC().Format(time.RFC3339Nano) +
			" and its answer was never stored (the gateway that sent it stopped or lost the key, or the upstream switched protocols: a session is no answer to store)",
	} {
		rec := httptest.NewRecorder()
		outcomeUnknown(lease, at, why).write(rec)
		const least = 4 << 10 // the least max_stored_response the fix accepts (minStoredResponse)
		if n := rec.Body.Len(); n > least {
			t.Errorf("a problem of %d bytes; the least max_stored_response is %d", n, least)
		} else {
			t.Logf("largest problem: %d bytes", n)
		}
	}
}
