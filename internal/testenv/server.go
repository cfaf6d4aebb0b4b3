package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process of the test's own, for tests that kill,
// pause or flush Redis. It is stopped when the test ends.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd's process has exited (and was waited for)
}

// StartRedis starts a redis-server on a free loopback port, with no
// persistence, and waits until it answers PING. Extra args are passed to
// the server (e.g. "--replicaof", host, port).
func StartRedis(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Require(t, EnvRedisServer), dir: t.TempDir(), port: FreePort(t), args: args}
	t.Cleanup(s.Kill) // also when it does not get ready: it is not left running
	if err := s.start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	return s
}

// Addr is the server's host:port; it stays the same across Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// Client returns a new client of the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--enable-debug-command", "yes", "--protected-mode", "no",
	}, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	return waitReady(s.Addr(), cmd.Process.Pid, exited, 10*time.Second)
}

// Kill stops the server with SIGKILL, as a crash would. It does nothing if
// the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("restart redis-server: %v", err)
	}
}

// waitReady polls addr until the redis-server of process pid answers
// there, or the limit passes, or the process exits. Another server on the
// port (another package's, which drew the same free port: a server that
// could not bind it exits) is not taken for it.
func waitReady(addr string, pid int, exited <-chan struct{}, limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(limit)
	backoff := 5 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		if err != nil && strings.Contains(err.Error(), "unknown command") {
			// A server started with INFO renamed away: PING, and its
			// process still running, is all there is to go by.
			err = c.Ping(ctx).Err()
			info = "\nprocess_id:" + strconv.Itoa(pid) + "\r"
		}
		cancel()
		if err == nil {
			if strings.Contains(info, "\nprocess_id:"+strconv.Itoa(pid)+"\r") {
				// INFO answers while the server still loads its data; PING
				// only once it serves.
				pctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err = c.Ping(pctx).Err()
				cancel()
				select {
				case <-exited:
					err = fmt.Errorf("process %d exited", pid)
				default:
					if err == nil {
						return nil
					}
				}
			} else {
				err = fmt.Errorf("another server answers there, not process %d", pid)
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server (process %d) exited before it served on %s: %w", pid, addr, err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s: %w", addr, limit, err)
		}
		time.Sleep(backoff) // polling a process we started: there is no event to wait on
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago. It is
// below Linux's ephemeral range (32768-60999), so that no client
// connection takes it as its own before a server binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(10000+rand.IntN(22768)))
		if err != nil {
			continue // taken
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		return port
	}
	t.Fatal("free port: 100 ports in 10000-32767 taken")
	return 0
}
