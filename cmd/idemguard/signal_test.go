package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondSignalExits: the first SIGINT makes serve drain its requests
// in flight for shutdown_timeout (here a minute, for a request that never
// ends); a second one ends the process at once, as Ctrl-C twice does in
// most servers. Before, every signal after the first was swallowed until
// the command returned.
func TestSecondSignalExits(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	t.Cleanup(func() { close(release); up.Close() })
	g := startGatewayProc(t, fmt.Sprintf(`listen: "{listen}"
upstream: %s
shutdown_timeout: 1m
redis: {addrs: ["%s"], prefix: "%s"}
log: {level: warn}
routes:
  - pattern: POST /orders
    caller: {single: true}
`, up.URL, testenv.RedisAddr(t), testenv.Prefix(t)))
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k-signal")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	g.mu.Lock()
	cmd := g.cmd
	g.mu.Unlock()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the gateway stops taking connections", func() bool {
		resp, err := http.Get(g.url + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	select {
	case err := <-exited:
		t.Fatalf("the gateway exited on the first signal (%v), with a request in flight and a minute to drain it", err)
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
			t.Fatalf("after the second signal: %v; want the process ended by SIGINT", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway still runs 10 s after a second SIGINT")
	}
	g.mu.Lock()
	g.cmd = nil // waited for
	g.mu.Unlock()
}
