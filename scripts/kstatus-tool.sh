#!/usr/bin/env bash
# Builds the e2e tier's kstatus checker (tests/e2e/kstatus: the status sigs.k8s.io/cli-utils' kstatus computes
# for resources given as JSON, as Flux's health checks see them) and caches it outside the repository:
#
#   BIN=$(scripts/kstatus-tool.sh | tail -1)    # progress goes to stderr, the bin dir is the last line
#   kubectl get topo pageload -o json | "$BIN/kstatus"
#   scripts/kstatus-tool.sh --check             # build if needed, then check tests/support/health_cases.py's documents
#
# Cache: ${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}/kstatus-<cli-utils version>/bin/kstatus, with the
# module and build caches (gomod/, gocache/) that scripts/k8s-tools.sh uses beside it (k8s.io/apimachinery is
# usually there already). The binary is rebuilt when the checker's source changes (a hash of go.mod and main.go
# is kept beside it). It is built under a temporary name, run once and moved into place, so an interrupted run
# never leaves a binary that counts as cached. Builds at nice 19 with GOFLAGS=-p=2; about a minute when cold.
set -euo pipefail

KSTATUS_VERSION="${KSTATUS_VERSION:-v0.37.2}"   # sigs.k8s.io/cli-utils

REPO="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$REPO/tests/e2e/kstatus"
CACHE_ROOT="${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}"
DIR="$CACHE_ROOT/kstatus-${KSTATUS_VERSION}"
BIN="$DIR/bin"

log() { printf '[kstatus-tool %s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check_cases() {   # the real kstatus on the documents of tests/support/health_cases.py, against what they expect
    local cases python failed=0 name want argo got
    python="${PYTHON:-$REPO/.venv/bin/python}"
    [ -x "$python" ] || python=python3
    cases="$(mktemp -d)"
    trap 'rm -rf "$cases"' RETURN
    PYTHONPATH="$REPO/operator/src:$REPO/tests" "$python" "$REPO/tests/support/health_cases.py" "$cases"
    while IFS=$'\t' read -r name want argo; do
        got="$("$BIN/kstatus" "$cases/$name.json")"
        if [ "$(cut -f2 <<<"$got")" = "$want" ]; then
            printf 'ok      %-34s %s\n' "$name" "$(cut -f2- <<<"$got")"
        else
            printf 'WRONG   %-34s expected %s, kstatus says: %s\n' "$name" "$want" "$(cut -f2- <<<"$got")"
            failed=1
        fi
    done <"$cases/expected.tsv"
    return "$failed"
}

hash="$(cat "$SRC/go.mod" "$SRC/main.go" | sha256sum | cut -c1-16)"
if [ -x "$BIN/kstatus" ] && [ "$(cat "$DIR/source.sha256" 2>/dev/null)" = "$hash" ]; then
    log "cached in $DIR"
else
    command -v go >/dev/null 2>&1 || die "go is not on PATH (a Go toolchain >= 1.24 is needed)"
    export GOMODCACHE="$CACHE_ROOT/gomod"
    export GOCACHE="$CACHE_ROOT/gocache"
    export GOFLAGS="-p=2 -modcacherw -buildvcs=false"
    export GOWORK=off GO111MODULE=on CGO_ENABLED=0
    NICE=(nice -n 19)
    if command -v ionice >/dev/null 2>&1; then NICE=(ionice -c 3 "${NICE[@]}"); fi
    mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"
    exec 9>"$DIR/.lock"
    flock 9   # one build per cache dir at a time
    build="$(mktemp -d "$DIR/build.XXXXXX")"
    trap 'rm -rf "$build"' EXIT
    cp "$SRC/go.mod" "$SRC/main.go" "$build/"
    [ -f "$SRC/go.sum" ] && cp "$SRC/go.sum" "$build/"
    log "building the kstatus checker with sigs.k8s.io/cli-utils $KSTATUS_VERSION (go $(go env GOVERSION))"
    (cd "$build" && go mod edit -require="sigs.k8s.io/cli-utils@$KSTATUS_VERSION" \
        && "${NICE[@]}" go mod tidy \
        && "${NICE[@]}" go build -trimpath -o "$BIN/kstatus.tmp" .)
    got="$(cd "$build" && go list -m -f '{{.Version}}' sigs.k8s.io/cli-utils)"
    [ "$got" = "$KSTATUS_VERSION" ] || die "built with cli-utils $got, not $KSTATUS_VERSION"
    echo '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"}}' | "$BIN/kstatus.tmp" >/dev/null \
        || die "the built checker does not run"
    mv "$BIN/kstatus.tmp" "$BIN/kstatus"
    echo "$hash" >"$DIR/source.sha256"
    log "built $BIN/kstatus"
fi

if [ "${1:-}" = "--check" ]; then
    check_cases
fi
echo "$BIN"
