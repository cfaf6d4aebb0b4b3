// Package testenv gives tests the real services that `make test` starts,
// named by IDEMGUARD_* environment variables. Without a variable, a test
// that needs it is skipped with a message naming it; under `make test`
// (IDEMGUARD_REQUIRE_SERVICES=1) a missing variable fails the test instead,
// so the full run never skips silently.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq" // the PostgreSQL driver for Postgres
	"github.com/redis/go-redis/v9"
)

// The variables `make test` sets.
const (
	EnvRedis       = "IDEMGUARD_REDIS_ADDR"          // host:port of a standalone Redis
	EnvCluster     = "IDEMGUARD_REDIS_CLUSTER_ADDRS" // comma-separated masters of a 3-master Cluster
	EnvRedlock     = "IDEMGUARD_REDLOCK_ADDRS"       // comma-separated independent Redis nodes
	EnvReplication = "IDEMGUARD_REDIS_REPLICATION"   // "master,replica" host:port pair
	EnvPostgres    = "IDEMGUARD_POSTGRES_DSN"        // a PostgreSQL 15 URL
	EnvRedisServer = "IDEMGUARD_REDIS_SERVER"        // path of the redis-server binary, for tests that start their own
	EnvPostgresBin = "IDEMGUARD_POSTGRES_BIN"        // PostgreSQL's bin directory, for tests that start their own
	EnvRequire     = "IDEMGUARD_REQUIRE_SERVICES"    // "1": a missing variable fails instead of skipping
)

// Require returns the value of the variable name, or skips the test (fails
// it under IDEMGUARD_REQUIRE_SERVICES=1) when it is not set.
func Require(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	msg := fmt.Sprintf("%s is not set: this test needs a real service (run `make test`)", name)
	if os.Getenv(EnvRequire) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// List splits a comma-separated variable.
func List(t testing.TB, name string) []string {
	t.Helper()
	return strings.Split(Require(t, name), ",")
}

// RedisAddr returns the standalone Redis address.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return Require(t, EnvRedis)
}

// Redis returns a client of the standalone Redis, closed when the test ends.
// Tests share this server: write only under Prefix(t), never FLUSHALL (use
// StartRedis for that).
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RedisAddr(t), PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster returns a client of the 3-master Redis Cluster, closed when the
// test ends.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: List(t, EnvCluster), PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a Redis key prefix unique to this test run, so tests that
// share a server never see each other's keys.
func Prefix(t testing.TB) string {
	return "t:" + sanitize(t.Name()) + ":" + strings.ToLower(rand.Text()[:8]) + ":"
}

var unsafe = regexp.MustCompile(`[^a-zA-Z0-9_]+`)

func sanitize(s string) string {
	s = unsafe.ReplaceAllString(s, "_")
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// PostgresDSN returns the PostgreSQL URL.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return Require(t, EnvPostgres)
}

// DSNWithIsolation is dsn with its connections' default transaction
// isolation set to level ("repeatable read", "serializable"), as a
// server's or role's default may make it.
func DSNWithIsolation(t testing.TB, dsn, level string) string {
	t.Helper()
	return DSNWith(t, dsn, "default_transaction_isolation", level)
}

// DSNWith is dsn with its connections' run-time parameter param (a
// session setting: search_path, timezone) set to value.
func DSNWith(t testing.TB, dsn, param, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(param, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres returns a database handle whose search_path is a schema of its
// own, created for this test and dropped when it ends, and the URL that
// opens more connections into the same schema (for other processes).
func Postgres(t testing.TB) (*sql.DB, string) {
	t.Helper()
	base := PostgresDSN(t)
	schema := "t_" + strings.ToLower(sanitize(t.Name())) + "_" + strings.ToLower(rand.Text()[:8])
	admin, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvPostgres, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	dsn := u.String()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32) // database/sql keeps 2 by default: every other statement would connect anew
	t.Cleanup(func() {
		_ = db.Close()
		admin, err := sql.Open("postgres", base)
		if err != nil {
			return
		}
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.ExecContext(ctx, `DROP SCHEMA "`+schema+`" CASCADE`)
	})
	return db, dsn
}
