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
//
// At load 20-37 the resumed process's embedded Redis answered too late
// for seconds more (189 "store unavailable" answers in one run): holders
// that had placed their orders could not store them, and copies placed
// them again once the leases ran out. A store that answers within its
// bounds reports no call unavailable, even under a lease that really is
// too short, so the demo's count of unavailable store calls is the
// evidence that a round was late: a round whose report is wrong beside
// it runs again with the lease doubled (testenv.OnTime). The handlers stop when their lease is
// lost (TestDemoHandlerStopsWhenItsLeaseIsLost), so a lost lease alone
// adds no effect; a round whose store answered in time checks as
// strictly as ever.
func TestDemoSurvivesStall(t *testing.T) {
	testenv.OnTime(t, "a lease", 10*time.Second, 3, func(lease time.Duration) bool {
		return demoStall(t, lease)
	})
}

var demoUnavailable = regexp.MustCompile(`guard outcomes: .*, unavailable (\d+)`)

// demoStall is a round of TestDemoSurvivesStall with the demo's --lease
// lease; late reports that the report is wrong and the demo's store
// calls were unavailable meanwhile (it came too late to prove anything).
func demoStall(t *testing.T, lease time.Duration) (late bool) {
	metrics := deadAddr(t)
	args := []string{"--keys", "60", "--copies", "4", "--work", "3s", "--messages", "8", "--metrics", metrics, "--lease", lease.String()}
	out := &testenv.Buffer{}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), demoChildEnv+"="+strings.Join(args, "\x1f"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
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
	var err error
	select {
	case err = <-exited:
		exited <- err
	case <-time.After(2 * time.Minute):
		t.Fatalf("demo still running after 2 minutes:\n%s", out.String())
	}
	problems := demoProblems(out.String(), 60, 8)
	if err != nil && len(problems) == 0 {
		t.Fatalf("demo: %v\n%s", err, out.String()) // it failed for something else than its report
	}
	if len(problems) == 0 {
		return false
	}
	if m := demoUnavailable.FindStringSubmatch(out.String()); m != nil && m[1] != "0" {
		t.Logf("the demo's store calls were unavailable %s times; its report:\n%s", m[1], out.String())
		return true
	}
	for _, p := range problems {
		t.Error(p)
	}
	return false
}
