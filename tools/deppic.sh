#!/usr/bin/env bash
# Prints the dependency picture docs/design.md holds: each package of every
# module in go.work and the repository's packages it imports (tests left
# out), one line per package, and fails if guard imports anything of the
# repository but scripts and internal packages, or if docs/design.md's
# picture is not this one.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mapfile -t modules < <($GO work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
root=github.com/idemguard/idemguard
for m in "${modules[@]}"; do
  (cd "$m" && $GO list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' ./...)
done | awk -v root="$root" '
  { line = substr($1, length(root) + 2); if (line == "") line = "(root)"
    deps = ""
    for (i = 2; i <= NF; i++) if (index($i, root "/") == 1) deps = deps " " substr($i, length(root) + 2)
    print line " →" (deps == "" ? " (none)" : deps) }' | sort -u > /tmp/deppic.$$
cat /tmp/deppic.$$
bad=$(awk '$1 ~ /^guard(\/|$)/ { for (i = 3; i <= NF; i++) if ($i !~ /^(guard|scripts|internal)(\/|$)/ && $i != "(none)") print $1 " → " $i }' /tmp/deppic.$$)
stale=$(diff <(awk '/^## 12\./ { sec = 1 } sec && /^```$/ { if (inblock) exit; inblock = 1; next } inblock' docs/design.md) /tmp/deppic.$$ || true)
rm -f /tmp/deppic.$$
if [ -n "$bad" ]; then echo "deppic: guard imports beyond the core:" >&2; echo "$bad" >&2; exit 1; fi
if [ -n "$stale" ]; then echo "deppic: docs/design.md's picture differs (< design.md, > code):" >&2; echo "$stale" >&2; exit 1; fi
