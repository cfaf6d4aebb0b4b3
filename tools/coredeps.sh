#!/usr/bin/env bash
# Shows that a service importing only the core (guard and httpx) gets
# none of the adapters' or tooling's dependencies in its build list: it
# builds a throwaway module that imports both, prints `go list -m all`,
# and fails if a forbidden module appears (issue: one core module).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/go.mod" <<MOD
module example.com/payments

go 1.26.0

require github.com/idemguard/idemguard v0.0.0-00010101000000-000000000000

replace github.com/idemguard/idemguard => $root
MOD
cat >"$dir/main.go" <<'GO'
package main

import (
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

func main() {
	store := guard.NewRedisStore(redis.NewClient(&redis.Options{}), guard.RedisOptions{})
	g := guard.New(store, guard.Options{})
	_ = httpx.Guard(g, httpx.Options{SingleCaller: true})(http.NotFoundHandler())
}
GO
cd "$dir"
GOWORK=off GOFLAGS=-mod=mod $GO mod tidy >/dev/null
GOWORK=off $GO build -o /dev/null .
list=$(GOWORK=off $GO list -m all)
echo "$ go list -m all   # a program importing only guard and httpx"
echo "$list"
bad=$(echo "$list" | grep -E 'gonum|toxiproxy|porcupine|nats-server|nats\.go|franz-go|kfake|watermill|prometheus|progressbar|zerolog|grpc|opentelemetry|gin-gonic|labstack|gofiber|fasthttp' || true)
if [ -n "$bad" ]; then
  echo "coredeps: the core pulls in modules it must not:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "coredeps: none of the adapters' or tooling's modules"
