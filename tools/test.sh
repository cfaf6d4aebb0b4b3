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
status=0
for m in "${modules[@]}"; do
  echo "== module $m"
  (cd "$m" && $GO vet ./... && $GO test $TEST_FLAGS ./...) || status=1
done
exit $status
