#!/usr/bin/env bash
# Builds the Kubernetes test tier's binaries from Go modules and caches them outside the repository:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3)
# and helm (helm.sh/helm/vN). No container registry is needed: only the Go module proxy.
#
#   BIN=$(scripts/k8s-tools.sh | tail -1)      # progress goes to stderr, the bin dir is the last line
#   scripts/k8s-tools.sh helm                  # only the tools named (here helm: a few minutes, not 20-30)
#
# Cache: ${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}/k8s-<k8s>-etcd-<etcd>-helm-<helm>/bin, plus the
# module and build caches (gomod/, gocache/) beside it so re-builds reuse them. Delete the directory to reclaim
# the space (about 5 GB after a full build, mostly gocache/). When all six binaries exist nothing is built; otherwise only the
# missing ones are. A binary is built under a temporary name, checked (--version) and then moved into place, so
# an interrupted run never leaves a half-built binary that counts as cached: just run the script again.
# A cold build takes 20-30 minutes on 2 cores; it runs at nice 19 with GOFLAGS=-p=2.
#
# k8s.io/kubernetes replaces its staging modules (k8s.io/api, k8s.io/client-go, ...) with ./staging/...
# directories, so `go install k8s.io/kubernetes/cmd/...@v1.x` is refused. The script generates a wrapper module
# whose go.mod requires k8s.io/kubernetes and replaces every staging module with its published v0.<minor>.<patch>
# version, read from k8s.io/kubernetes' own go.mod.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"    # the version k8s.io/kubernetes v1.34.3 requires
HELM_VERSION="${HELM_VERSION:-v3.22.0}"   # a v4.x.y version selects the helm.sh/helm/v4 module

CACHE_ROOT="${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}"
DIR="$CACHE_ROOT/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
BIN="$DIR/bin"
WRAPPER="$DIR/wrapper"
ALL_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd helm)
# The tools to provide: those named on the command line, or all. `make test` builds helm alone first, so the
# chart tests of lane 1 have it within minutes while lane 2 builds the rest (issue 38: on a machine without
# the cache they ran before helm existed).
TOOLS=("${ALL_TOOLS[@]}")
if [ $# -gt 0 ]; then
    TOOLS=()
    for t in "$@"; do
        case " ${ALL_TOOLS[*]} " in
            *" $t "*) TOOLS+=("$t") ;;
            *) echo "k8s-tools: unknown tool '$t' (one of: ${ALL_TOOLS[*]})" >&2; exit 2 ;;
        esac
    done
fi

log() { printf '[k8s-tools %s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
fmt_dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

missing_tools() {
    local t
    for t in "${TOOLS[@]}"; do
        [ -x "$BIN/$t" ] || echo "$t"
    done
}

# Fast path: everything is cached (the binaries only ever appear through an atomic mv).
if [ -z "$(missing_tools)" ]; then
    echo "k8s-tools: cached in $DIR" >&2
    echo "$BIN"
    exit 0
fi

command -v go >/dev/null 2>&1 || die "go is not on PATH (a Go toolchain >= 1.24 is needed)"

# ---- versions derived from the inputs --------------------------------------------------------------------
k8s_v="${K8S_VERSION#v}"                       # 1.34.3
K8S_MAJOR="${k8s_v%%.*}"                       # 1
k8s_rest="${k8s_v#*.}"                         # 34.3
K8S_MINOR="${k8s_rest%%.*}"                    # 34
STAGING_VERSION="v0.${k8s_rest}"               # v0.34.3: the staging modules' published version
[ "$K8S_MAJOR" = 1 ] || die "K8S_VERSION must be v1.x.y (got $K8S_VERSION)"
helm_v="${HELM_VERSION#v}"
HELM_MAJOR="${helm_v%%.*}"
HELM_MODULE="helm.sh/helm/v${HELM_MAJOR}"

# ---- Go environment: module and build caches under the cache root, reused across versions and runs -------
export GOMODCACHE="$CACHE_ROOT/gomod"
export GOCACHE="$CACHE_ROOT/gocache"
export GOFLAGS="-p=2 -modcacherw -buildvcs=false"   # -modcacherw: the cache can be removed with rm -rf
export GOWORK=off                                    # a go.work above the cache dir must not interfere
export GO111MODULE=on
export CGO_ENABLED=0                                 # static binaries, as the upstream release builds are
NICE=(nice -n 19)
if command -v ionice >/dev/null 2>&1; then NICE=(ionice -c 3 "${NICE[@]}"); fi

mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"

# One build per cache dir at a time; a second run waits, then finds the binaries cached.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.lock"
    if ! flock -n 9; then
        log "another k8s-tools run holds $DIR/.lock; waiting for it"
        flock 9
    fi
fi
# Leftovers of an interrupted run (we hold the lock, so nothing else is writing them).
rm -rf "$BIN"/.*.tmp.* "$DIR"/.helm-gobin.* "$WRAPPER.tmp"

MISSING=$(missing_tools | tr '\n' ' ')
if [ -z "${MISSING// /}" ]; then
    echo "k8s-tools: cached in $DIR" >&2
    echo "$BIN"
    exit 0
fi

log "cache dir $DIR"
log "to build: $MISSING(go $(go env GOVERSION), GOFLAGS=$GOFLAGS, nice 19)"

# ---- steps -----------------------------------------------------------------------------------------------
T_START=$(date +%s)
CURRENT_STEP=""
STEP_T0=0
SUMMARY=()
on_exit() {
    local rc=$?
    rm -rf "$BIN"/.*.tmp.$$ "$DIR/.helm-gobin.$$" "$WRAPPER.tmp"
    if [ "$rc" -ne 0 ] && [ -n "$CURRENT_STEP" ]; then
        log "FAILED: $CURRENT_STEP (exit $rc) after $(fmt_dur $(($(date +%s) - STEP_T0))); re-run to resume"
    fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() {   # step NAME COMMAND...: runs COMMAND (set -e applies inside) with a progress line and its wall time
    CURRENT_STEP="$1"
    shift
    STEP_T0=$(date +%s)
    log "start: $CURRENT_STEP"
    "$@"
    local dt=$(($(date +%s) - STEP_T0))
    log "done:  $CURRENT_STEP in $(fmt_dur "$dt")"
    SUMMARY+=("$(printf '%-32s %s' "$CURRENT_STEP" "$(fmt_dur "$dt")")")
    CURRENT_STEP=""
}

json_field() {   # json_field KEY: the string value of "KEY" in `go mod download -json` output on stdin
    sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" | head -n 1
}

K8S_LDFLAGS=""
prepare_wrapper() {
    local tmp="$WRAPPER.tmp" json gomod info build_date staging
    rm -rf "$tmp"
    mkdir -p "$tmp"
    json=$(cd "$tmp" && "${NICE[@]}" go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
    gomod=$(printf '%s\n' "$json" | json_field GoMod)
    info=$(printf '%s\n' "$json" | json_field Info)
    [ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION in: $json"

    # The staging modules: every `X => ./staging/src/k8s.io/...` line of k8s.io/kubernetes' go.mod, in the
    # block form (`<tab>X => ./staging/...`) as well as the one-line form (`replace X => ./staging/...`).
    staging=$(awk '{
        for (i = 2; i < NF; i++) if ($i == "=>" && $(i + 1) ~ /^\.\/staging\//) {
            m = $1; if (m == "replace") m = $2; print m
        }
    }' "$gomod" | sort -u)
    [ -n "$staging" ] || die "no ./staging replace lines found in $gomod"
    log "$(printf '%s\n' "$staging" | wc -l | tr -d ' ') staging modules -> $STAGING_VERSION"

    {
        echo "// Generated by scripts/k8s-tools.sh; do not edit. Builds k8s.io/kubernetes commands outside its repo."
        echo "module example.local/elastream-k8s-tools"
        echo
        # The go and godebug lines of k8s.io/kubernetes: they only take effect in the main module.
        awk '/^go [0-9]/ { print; exit }' "$gomod"
        awk 'blk { print; if ($0 ~ /^\)/) blk = 0; next }
             /^godebug[[:space:]]*\(/ { print; blk = 1; next }
             /^godebug[[:space:]]/ { print }' "$gomod"
        echo
        echo "require ("
        printf '\tk8s.io/kubernetes %s\n' "$K8S_VERSION"
        printf '\tgo.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION"
        echo ")"
        echo
        echo "replace ("
        printf '%s\n' "$staging" | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
        echo ")"
    } >"$tmp/go.mod"
    cat >"$tmp/tools.go" <<'EOF'
//go:build tools

// Package tools records the commands scripts/k8s-tools.sh builds, so that `go mod tidy` keeps their deps.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
    (cd "$tmp" && "${NICE[@]}" go mod tidy)

    # MVS may have raised a version above the one asked for (e.g. ETCD_VERSION older than k8s requires).
    local got_k8s got_etcd
    got_k8s=$(cd "$tmp" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
    got_etcd=$(cd "$tmp" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
    [ "$got_k8s" = "$K8S_VERSION" ] || die "wrapper resolved k8s.io/kubernetes $got_k8s, not $K8S_VERSION"
    [ "$got_etcd" = "$ETCD_VERSION" ] ||
        die "wrapper resolved go.etcd.io/etcd/server/v3 $got_etcd, not $ETCD_VERSION (k8s $K8S_VERSION requires it)"
    rm -rf "$WRAPPER"
    mv "$tmp" "$WRAPPER"

    # Version stamping as hack/lib/version.sh does it; the build date is the release's (reproducible).
    build_date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)
    local pkg
    K8S_LDFLAGS="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$K8S_MAJOR -X $pkg.gitMinor=$K8S_MINOR"
        [ -z "$build_date" ] || K8S_LDFLAGS+=" -X $pkg.buildDate=$build_date"
    done
}

check_version() {   # check_version FILE EXPECTED CMD-ARGS...: FILE's version output must contain EXPECTED
    local file=$1 want=$2 out
    shift 2
    out=$("$file" "$@" 2>&1) || die "$file $* failed: $out"
    case "$out" in
        *"$want"*) ;;
        *) die "$(basename "$file") reports '$out', expected $want" ;;
    esac
}

build_k8s() {   # build_k8s NAME: k8s.io/kubernetes/cmd/NAME
    local name=$1 tmp="$BIN/.$1.tmp.$$"
    (cd "$WRAPPER" && "${NICE[@]}" go build -pgo=off -trimpath -ldflags "$K8S_LDFLAGS" -o "$tmp" \
        "k8s.io/kubernetes/cmd/$name")
    if [ "$name" = kubectl ]; then
        check_version "$tmp" "$K8S_VERSION" version --client
    else
        check_version "$tmp" "Kubernetes $K8S_VERSION" --version
    fi
    mv -f "$tmp" "$BIN/$name"
}

build_etcd() {   # the package's own binary name is `server`, hence -o
    local tmp="$BIN/.etcd.tmp.$$"
    (cd "$WRAPPER" && "${NICE[@]}" go build -pgo=off -trimpath -ldflags "-s -w" -o "$tmp" go.etcd.io/etcd/server/v3)
    check_version "$tmp" "etcd Version: ${ETCD_VERSION#v}" --version
    mv -f "$tmp" "$BIN/etcd"
}

build_helm() {   # `go install` in helm's own module (no replaces there), stamped like helm's Makefile does
    local gobin="$DIR/.helm-gobin.$$" json gomod ldflags cgv cg_major cg_minor
    json=$(cd "$DIR" && "${NICE[@]}" go mod download -json "$HELM_MODULE@$HELM_VERSION")
    gomod=$(printf '%s\n' "$json" | json_field GoMod)
    [ -f "$gomod" ] || die "no go.mod for $HELM_MODULE@$HELM_VERSION in: $json"
    ldflags="-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION"
    if [ "$HELM_MAJOR" = 3 ]; then
        # helm v3's default .Capabilities.KubeVersion (helm template) and lint's deprecation checks follow
        # its client-go version (v0.X.Y -> 1.X); without this they say v1.20.
        cgv=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")
        cgv=${cgv#v}
        cg_major=$((${cgv%%.*} + 1))
        cg_minor=${cgv#*.}
        cg_minor=${cg_minor%%.*}
        local p
        for p in pkg/lint/rules pkg/chartutil; do
            ldflags+=" -X $HELM_MODULE/$p.k8sVersionMajor=$cg_major -X $HELM_MODULE/$p.k8sVersionMinor=$cg_minor"
        done
    fi
    rm -rf "$gobin"
    mkdir -p "$gobin"
    (cd "$DIR" && GOBIN="$gobin" "${NICE[@]}" go install -pgo=off -trimpath -ldflags "$ldflags" \
        "$HELM_MODULE/cmd/helm@$HELM_VERSION")
    check_version "$gobin/helm" "$HELM_VERSION" version --short
    mv -f "$gobin/helm" "$BIN/.helm.tmp.$$"
    mv -f "$BIN/.helm.tmp.$$" "$BIN/helm"
    rm -rf "$gobin"
}

needs() { case " $MISSING" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if needs kube-apiserver || needs kube-controller-manager || needs kube-scheduler || needs kubectl || needs etcd; then
    step "wrapper module (go mod tidy)" prepare_wrapper
fi
for t in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if needs "$t"; then step "build $t" build_k8s "$t"; fi
done
if needs etcd; then step "build etcd" build_etcd; fi
if needs helm; then step "build helm" build_helm; fi

[ -z "$(missing_tools)" ] || die "still missing after the build: $(missing_tools | tr '\n' ' ')"

log "all built in $(fmt_dur $(($(date +%s) - T_START))):"
for s in "${SUMMARY[@]}"; do log "  $s"; done
log "versions:"
{
    for t in "${TOOLS[@]}"; do
        case "$t" in
            helm) echo "\$ helm version --short"; "$BIN/helm" version --short ;;
            kubectl) echo "\$ kubectl version --client"; "$BIN/kubectl" version --client ;;
            *) echo "\$ $t --version"; "$BIN/$t" --version ;;
        esac
    done
} >&2
ls -l "${TOOLS[@]/#/$BIN/}" >&2
echo "$BIN"
