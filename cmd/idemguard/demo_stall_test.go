package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// demoChildEnv, set in a child of these tests, makes the test binary run
// the demo with the arguments it holds (separated by \x1f), as
// serveChildEnv runs the gateway.
const demoChildEnv = "IDEMGUARD_DEMO_CHILD"

func init() {
	if args := os.Getenv(demoChildEnv); args != "" {
		os.Exit(run(context.Background(), append([]string{"demo"}, strings.Split(args, "\x1f")...), os.Stdout, os.Stderr))
	}
}

// TestDemoSurvivesStall: the demo's process stops for two and a half
// seconds (a loaded machine's stall, here SIGSTOP) while every key's first
// copy is running, and still shows each effect once. Every key is in
// flight at once, so a default lease whose first deadline that stall
// outlives loses them all, and their copies run the effect again: with
// 2 s leases a loaded test run once counted 68 effects for 60 keys. (A
// stall of four seconds left too little of the 10 s lease for a resumed
// process to extend in, during make test's test lanes on two cores: 73
// effects, 14 leases lost.)
func TestDemoSurvivesStall(t *testing.T) {
	metrics := deadAddr(t)
	args := []string{"--keys", "60", "--copies", "4", "--work", "3s", "--messages", "8", "--metrics", metrics}
	out := &lockedBuffer{}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), demoChildEnv+"="+strings.Join(args, "\x1f"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	acquired := regexp.MustCompile(`idemguard_outcomes_total\{kind="acquired"\} (\d+)`)
	testenv.WaitFor(t, time.Minute, "every key claimed", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := acquired.FindSubmatch(b)
		if m == nil {
			return false
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n >= 60
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the stall itself
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("demo: %v\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("demo still running after 2 minutes:\n%s", out.String())
	}
	checkDemo(t, out.String(), 60, 8)
}
