package gateway

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryConnectBounded: a fallback PostgreSQL that accepts the
// connection and never answers (a wedged server or pooler) fails the
// connection within a bound. lib/pq ignores the context while it waits
// for the server's first answer, so without a connect_timeout every
// request the secondary serves during a Redis outage hung for good.
func TestSecondaryConnectBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() }) // accepted, never answered
		}
	}()
	t.Setenv("IDEMGUARD_TEST_SILENT_PG", "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable")
	cfg, err := Parse("gw.yaml", []byte(`upstream: http://127.0.0.1:1
redis: {addrs: ["127.0.0.1:1"]}
fallback: {policy: secondary, postgres_env: IDEMGUARD_TEST_SILENT_PG}
routes: [{pattern: POST /o, caller: {single: true}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(cfg, Options{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	done := make(chan error, 1)
	go func() { done <- gw.db.PingContext(context.Background()) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a silent server answered the ping")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("connecting to a PostgreSQL that never answers still waits after 20s")
	}
}
