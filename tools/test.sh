#!/usr/bin/env bash
# Vets and tests every module of the repository (the root and each module
# listed in go.work), with the flags in TEST_FLAGS. tools/services.sh runs
# it with the services' addresses set.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_FLAGS=${TEST_FLAGS:--race -count=1 -timeout 20m}
# The modules: every directory go.work uses, the root first.
mapfile -t modules < <($GO work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
[ ${#modules[@]} -gt 0 ] || modules=(.)
# staticcheck, at the version the project checks with, built once into
# the module cache's bin directory.
STATICCHECK_VERSION=${STATICCHECK_VERSION:-v0.8.2}
gobin="$($GO env GOPATH)/bin"
staticcheck="$gobin/staticcheck-$STATICCHECK_VERSION"
if [ ! -x "$staticcheck" ]; then
  tmp=$(mktemp -d)
  GOBIN="$tmp" GOWORK=off $GO install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  mkdir -p "$gobin" && mv "$tmp/staticcheck" "$staticcheck" && rmdir "$tmp"
fi
status=0
# The core's build list holds none of the adapters' dependencies.
./tools/coredeps.sh >/dev/null || { ./tools/coredeps.sh || true; status=1; }
# guard imports nothing of the repository but scripts and internal packages.
./tools/deppic.sh >/dev/null || status=1
for m in "${modules[@]}"; do
  echo "== module $m"
  (cd "$m" && $GO vet ./... && "$staticcheck" ./...) || status=1
  (cd "$m" && $GO test $TEST_FLAGS ./...) || status=1
done
exit $status
