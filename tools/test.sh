#!/usr/bin/env bash
# Vets, lints (staticcheck) and tests every module of the repository (the
# root and each module listed in go.work), with the flags in TEST_FLAGS,
# and checks the core's dependencies (tools/coredeps.sh, tools/deppic.sh).
# tools/services.sh runs it with the services' addresses set.
#
# First the CPU work that nothing times: the compiling of every module's
# tests, and the checks (vet, staticcheck, the dependency checks), which
# read what that compiling left in the build cache. Then
# three test lanes at once, because most of a test run is waiting (leases
# running out, servers restarting), not computing: the root module's
# tests, the command's followed by two of the root's packages (late_root),
# and the other modules' tests one after another;
# then the proof suite alone. Each step prints a line as it ends; the full
# output of every step follows at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_FLAGS=${TEST_FLAGS:--race -count=1 -timeout 20m}
# The modules: every directory go.work uses, the root first.
# (go work edit on a line of its own: set -e stops the run if it fails.)
work=$($GO work edit -json)
mapfile -t modules < <(printf '%s\n' "$work" | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
[ ${#modules[@]} -gt 0 ] || { echo "test.sh: go.work lists no module" >&2; exit 1; }

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$(date +%s)

# logfile NAME: where step NAME's output goes, without the .log.
logfile() { echo "$logs/$(printf '%s' "$1" | tr ' /' '_.')"; }

# step NAME COMMAND...: runs COMMAND, its output to NAME's log, and prints
# one line saying how it ended and how long it took.
step() {
  local name=$1 file t0 rc=0
  shift
  file=$(logfile "$name")
  echo "$name" >"$file.name"
  t0=$(date +%s)
  "$@" >"$file.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok    $name ($(($(date +%s) - t0))s)"
  else
    echo "FAIL  $name ($(($(date +%s) - t0))s)"
    touch "$file.failed"
  fi
}

name() { [ "$1" = . ] && echo root || echo "${1#./}"; }

staticcheck="$($GO env GOPATH)/bin/staticcheck-${STATICCHECK_VERSION:-v0.8.2}"

# install_staticcheck builds staticcheck, at the version the project checks
# with, once into the Go path's bin directory.
install_staticcheck() {
  [ -x "$staticcheck" ] && return
  local tmp
  tmp=$(mktemp -d)
  GOBIN="$tmp" GOWORK=off $GO install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION:-v0.8.2}"
  mkdir -p "$(dirname "$staticcheck")" && mv "$tmp/staticcheck" "$staticcheck" && rmdir "$tmp"
}

# buildflags: the build flags among TEST_FLAGS (-race), which vet and
# staticcheck are given too (GOFLAGS), so that they read the export data
# the tests' build left in the cache rather than compile every package,
# and every dependency, a second time without them (on a fresh machine,
# much of the time before the tests went on that second compile).
# Vetting the race build only leaves out the files built without it
# (httpx/norace_test.go: a constant).
buildflags=$(for f in $TEST_FLAGS; do case $f in -race) printf '%s ' "$f" ;; esac; done)

# lint vets and lints module $1 with buildflags.
lint() (
  install_staticcheck &&
    cd "$1" &&
    GOFLAGS="${GOFLAGS:-} $buildflags" $GO vet ./... &&
    GOFLAGS="${GOFLAGS:-} $buildflags" "$staticcheck" ./...
)

# build compiles the packages of module $1 and their tests with the build
# flags among TEST_FLAGS (go list -export builds what it lists), so that
# the build cache holds them before any test runs, and links nothing: go
# test links each test binary when it runs it, whatever was linked before
# (linking them here too, with go test -exec true, cost the root module
# 105 s of CPU more, all of it on the way to the first test).
build() {
  step "build $(name "$1")" sh -c "cd '$1' && $GO list $buildflags -export -test -deps ./... >/dev/null"
}

# tests runs the tests of each module with TEST_FLAGS.
tests() {
  for m in "$@"; do
    step "test $(name "$m")" sh -c "cd '$m' && $GO test $TEST_FLAGS ./..."
  done
}

# The root module's packages that run in the command's lane, after the
# command's tests (root_tests late), so that the three lanes end together.
# make test on a fresh machine, 2026-12-03: with fallback and lock there,
# the root's lane took 380 s, the command's 287 s (153 s of it the
# command's own) and the other modules' 319 s; with pgstore too, 303 s,
# 399 s and 335 s (guard 191 s, lock 127 s, fallback 115 s, pgstore
# 107 s, httpx 104 s alone in their lane's -p 2).
late_root=(./lock ./pgstore)

# root_packages early|late lists the root module's packages that run in
# the root's own lane, or those of late_root.
root_packages() (
  cd "${modules[0]}" || exit 1
  late=$($GO list "${late_root[@]}") || exit 1
  all=$($GO list ./...) || exit 1
  for p in $all; do
    if printf '%s\n' "$late" | grep -qxF "$p"; then
      if [ "$1" = late ]; then echo "$p"; fi
    elif [ "$1" = early ]; then
      echo "$p"
    fi
  done
  exit 0
)

# root_run early|late runs the tests of those packages with TEST_FLAGS.
root_run() (
  pkgs=$(root_packages "$1") || exit 1
  [ -n "$pkgs" ] || { echo "no root packages listed as $1"; exit 1; }
  cd "${modules[0]}" || exit 1
  # shellcheck disable=SC2086 # TEST_FLAGS and pkgs are lists
  $GO test $TEST_FLAGS $pkgs
)

root_tests() { step "test root ($1)" root_run "$1"; }

# prepare builds each module, then vets and lints it from the cache.
prepare() {
  for m in "$@"; do
    build "$m"
    step "vet+staticcheck $(name "$m")" lint "$m"
  done
}

# Nothing is compiled or linted while a test runs: on a machine whose
# build cache is empty (a fresh CI machine), compiling the adapters'
# dependencies with -race beside the tests kept the load at 12-18 on two
# cores, and the command's storm tests and the demo, whose leases and
# timeouts are seconds, failed (a process starved of CPU is a paused
# process, which no lease protects: docs/design.md, "Leases"). The root
# and the command each start a lane; the other modules share one. The
# proof suite runs alone once the lanes are done: its partition and
# nemesis tests time a holder's cancellation to the millisecond.
long=() short=() last=()
for m in "${modules[@]:1}"; do
  case "$(name "$m")" in
    cmd/idemguard) long+=("$m") ;;
    proof) last+=("$m") ;;
    *) short+=("$m") ;;
  esac
done
# First the root module's build alone (every other module builds on its
# packages: built beside it, they would be compiled twice), beside
# staticcheck's install; then two chains at once, of about the same
# length: the root's checks and then the other modules of odd place in
# go.work, and those of even place.
odd=() even=()
for i in "${!modules[@]}"; do
  [ "$i" -eq 0 ] && continue
  if [ $((i % 2)) -eq 1 ]; then odd+=("${modules[$i]}"); else even+=("${modules[$i]}"); fi
done
step "staticcheck install" install_staticcheck &
build "${modules[0]}"
wait
{
  step "vet+staticcheck $(name "${modules[0]}")" lint "${modules[0]}"
  # The core's build list holds none of the adapters' dependencies, and
  # guard imports nothing of the repository but scripts and internal
  # packages. Built with buildflags, the throwaway program coredeps.sh
  # links reads the core's packages from the cache the tests' build
  # filled (without them: 46 s of compiling on a fresh machine).
  step "coredeps" env GOFLAGS="${GOFLAGS:-} $buildflags" ./tools/coredeps.sh
  step "deppic" ./tools/deppic.sh
  prepare ${odd[@]+"${odd[@]}"}
} &
prepare ${even[@]+"${even[@]}"} &
wait
root_tests early &
{
  [ ${#long[@]} -eq 0 ] || tests "${long[@]}"
  root_tests late
} &
[ ${#short[@]} -eq 0 ] || tests "${short[@]}" &
wait
# The proof suite's drills run four at a time, after its other tests
# (proof/main_test.go).
[ ${#last[@]} -eq 0 ] || TEST_FLAGS="$TEST_FLAGS -parallel 4" tests "${last[@]}"

for f in "$logs"/*.log; do
  echo
  echo "=== $(cat "${f%.log}.name")"
  cat "$f"
done
echo
# A lane that stopped before one of its steps (a shell error in the lane
# itself) leaves that step without a log: a step that never ran fails the
# run as a failed one does.
expected=(coredeps deppic "test root (early)" "test root (late)")
for m in "${modules[@]}"; do
  expected+=("build $(name "$m")" "vet+staticcheck $(name "$m")")
  [ "$m" = "${modules[0]}" ] || expected+=("test $(name "$m")")
done
never=()
for n in "${expected[@]}"; do
  [ -f "$(logfile "$n").log" ] || never+=("$n")
done
failed=$(find "$logs" -name '*.failed' | wc -l)
if [ "$failed" -gt 0 ] || [ ${#never[@]} -gt 0 ]; then
  echo "FAIL: $failed step(s) failed, ${#never[@]} never ran:"
  for f in "$logs"/*.failed; do [ -e "$f" ] && echo "  $(cat "${f%.failed}.name")"; done
  for n in ${never[@]+"${never[@]}"}; do echo "  $n (never ran)"; done
  echo "($(($(date +%s) - start))s)"
  exit 1
fi
echo "ok: every module vetted, linted and tested ($(($(date +%s) - start))s)"
