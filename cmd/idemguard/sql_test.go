package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// silentServer accepts connections and never answers: a hung server, a
// firewall that swallows packets after the handshake, a port given to the
// wrong service. It stops when the test ends.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// bounded runs the command line and fails the test if it takes longer
// than limit, which a command against a server that never answers must
// not (connectTimeout, and a retry).
func bounded(t *testing.T, limit time.Duration, args ...string) (code int, stderr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code   int
		stderr string
	}
	res := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		c := run(ctx, args, &out, &errb)
		res <- result{c, errb.String()}
	}()
	select {
	case r := <-res:
		return r.code, r.stderr
	case <-time.After(limit):
		cancel() // a context-blind hang still leaks: the test fails anyway
		t.Fatalf("%v: still running after %s against a server that does not answer", args, limit)
		return 0, ""
	}
}

// A service that accepts connections but never answers is reported as not
// answering, in bounded time, with exit 1: never a hang at 3 a.m.
func TestSilentServicesBounded(t *testing.T) {
	pg := "postgres://nobody@" + silentServer(t) + "/db?sslmode=disable"
	rd := silentServer(t)
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"migrate", "--postgres", pg, "up"}, "postgres does not answer"},
		{[]string{"purge", "--postgres", pg}, "postgres does not answer"},
		{[]string{"list", "--redis", rd}, "does not answer"},
	} {
		start := time.Now()
		code, stderr := bounded(t, 20*time.Second, c.args...)
		wantError(t, code, stderr, 1, c.text)
		t.Logf("%v: %s", c.args[0], time.Since(start).Round(time.Millisecond))
	}
}

// A DSN's own connect_timeout is kept.
func TestPostgresConnectTimeoutKept(t *testing.T) {
	for dsn, want := range map[string]time.Duration{
		"postgres://u@h/db":                   connectTimeout,
		"postgres://u@h/db?connect_timeout=9": 9 * time.Second,
		"host=h connect_timeout=1":            time.Second,
	} {
		cfg, err := postgresConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnectTimeout != want {
			t.Errorf("%s: connect timeout %s, want %s", dsn, cfg.ConnectTimeout, want)
		}
	}
	if _, err := postgresConfig("postgres://u:pw@h:bad/db"); err == nil || !errors.As(err, new(usageError)) {
		t.Errorf("a bad DSN: %v, want a usage error", err)
	}
}
