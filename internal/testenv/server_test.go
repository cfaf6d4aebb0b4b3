package testenv

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverPID asks the Redis at addr (password pass, may be empty) for its
// process id.
func serverPID(t *testing.T, addr, pass string) (int, error) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Password: pass})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`process_id:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0, nil
	}
	return strconv.Atoi(m[1])
}

// Restart "starts the server again on the same port". When the port was
// taken in the meantime (another test's FreePort picked it once Kill freed
// it: every package's tests draw from the same 10000-32767), the server's
// own redis-server cannot bind and exits, and Restart must refuse: it took
// the other process's answer for its own, and the test then killed,
// paused or flushed another test's server.
func TestRestartRefusesAnotherServerOnItsPort(t *testing.T) {
	t.Parallel()
	s := StartRedis(t)
	port := s.Port()
	s.Kill()

	// Another test's server takes the freed port.
	foreign := &Server{t: t, bin: s.bin, dir: t.TempDir(), port: port}
	if err := foreign.start(); err != nil {
		t.Fatalf("foreign server on %d: %v", port, err)
	}
	t.Cleanup(foreign.Kill)
	foreignPID := foreign.cmd.Process.Pid

	err := s.start() // what Restart runs; Restart Fatalfs on its error
	if err != nil {
		t.Logf("Restart refused, as it should: %v", err)
		return
	}
	ownPID := s.cmd.Process.Pid
	answered, perr := serverPID(t, s.Addr(), "")
	if perr != nil {
		t.Fatal(perr)
	}
	if answered != ownPID {
		t.Errorf("Restart reported its server ready on %s, but the server answering there is pid %d (another test's, started on the freed port: pid %d), not its own redis-server pid %d, which could not bind and exited",
			s.Addr(), answered, foreignPID, ownPID)
	}
}

// fakeStartTB is a testing.TB whose Fatal ends the goroutine and whose
// cleanups are kept, to see what StartRedis leaves behind when it fails.
type fakeStartTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	cleanups []func()
}

func (f *fakeStartTB) Helper() {}
func (f *fakeStartTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}
func (f *fakeStartTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeStartTB) Fatal(args ...any) { f.Fatalf("%v", args...) }

// StartRedis fails the test when the server does not get ready within
// 10 s (a starved machine, or a server that answers with an error), and
// the server it started is killed all the same: it registered the Kill
// only after that check, and the redis-server outlived the test binary.
// (cmd/idemguard/serve_test.go's startProc and pgenv's standby start had
// the same order.)
func TestFailedStartLeavesNoServer(t *testing.T) {
	t.Parallel()
	Require(t, EnvRedisServer)
	ft := &fakeStartTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A server that answers PING with an error (NOAUTH) never gets
		// ready as waitReady sees it: the stand-in for one that answers
		// too late.
		StartRedis(ft, "--requirepass", "testenv-pass")
	}()
	<-done
	if ft.fatal == "" {
		t.Fatal("StartRedis did not fail; the stimulus did not work")
	}
	t.Logf("StartRedis failed the test: %s", ft.fatal)
	// The test ends: its cleanups run.
	for i := len(ft.cleanups) - 1; i >= 0; i-- {
		ft.cleanups[i]()
	}
	m := regexp.MustCompile(`127\.0\.0\.1:(\d+)`).FindStringSubmatch(ft.fatal)
	if m == nil {
		t.Fatalf("no address in %q", ft.fatal)
	}
	addr := m[0]
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return // nothing listens: the server was stopped
	}
	_ = conn.Close()
	pid, err := serverPID(t, addr, "testenv-pass")
	if err == nil && pid > 0 {
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	t.Errorf("after the failed StartRedis's test ended (its cleanups run), its redis-server (pid %d) still listens on %s: leaked past the test and the test binary", pid, addr)
}
