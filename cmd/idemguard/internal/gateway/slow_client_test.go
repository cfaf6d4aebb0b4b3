package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// README, "Run it in front of any service": `timeout` is the
// time within which "the upstream must answer", and "an answer over
// max_stored_response reaches the first caller whole and is replayed as a
// response-not-kept problem". The route's timeout is put on the whole
// exchange, the streaming of a large answer to the client included: an
// upstream that answers at once, with a body larger than
// max_stored_response, to a client that reads it more slowly than the
// timeout allows (a mobile link, a large export), has its answer cut off
// at the timeout. The gateway logs "the upstream did not answer within the
// route's timeout", the first caller gets a truncated response, and every
// retry gets response-not-kept: the caller never gets the answer of an
// effect that ran.
func TestSlowClientGetsLargeAnswerWhole(t *testing.T) {
	const size = 64 << 20 // far more than the loopback's socket buffers hold
	big := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(big) // the whole answer at once: the upstream is not slow
		return true
	})
	// The gateway holds max_stored_response of the answer before it
	// streams the rest: the least there is, so that the upstream has
	// answered well within the timeout on a loaded machine too.
	const timeout = time.Second
	e := startGateway(t, basicConfig+"    timeout: 1s\n    max_stored_response: 4KiB\n", u.URL)

	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"slow1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-slow-client")
	req.Header.Set("X-Account-Id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	// The client is slow: it reads nothing for a while, longer than the
	// route's timeout (its slowness is the scenario, not a synchronisation).
	time.Sleep(3 * timeout)
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != size {
		t.Fatalf("the client read %d of %d bytes (%v): the upstream's answer, sent at once, was cut off at the route's "+
			"timeout because the client read it slowly", n, size, err)
	}
	if c := u.count("slow1"); c != 1 {
		t.Fatalf("upstream ran %d times, want 1", c)
	}
}

// An upstream whose large answer begins to stream and then stalls is still
// cut off: each read of a streamed answer must bring data within the
// route's timeout. The client's connection is cut (no truncated body read
// as whole) and the key keeps its marker.
func TestStalledStreamIsCut(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 8192)) // more than max_stored_response: it streams
		http.NewResponseController(w).Flush()
		select { // then nothing, until the gateway gives up
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		return true
	})
	e := startGateway(t, basicConfig+"    timeout: 300ms\n    max_stored_response: 4KiB\n", u.URL)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"stall1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-stall")
	req.Header.Set("X-Account-Id", "acme")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("the stalled answer read as whole; want the connection cut")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cut after %v; want about the route's timeout", d)
	}
	again := post(t, e.srv.URL+"/orders", "k-stall", `{"order":"stall1"}`, "X-Account-Id", "acme")
	if !again.replayed() || again.status != http.StatusCreated || !strings.Contains(again.body, "response-not-kept") {
		t.Fatalf("retry: %d %q; want the marker replayed", again.status, again.body)
	}
	if n := u.count("stall1"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}
