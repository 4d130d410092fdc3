#!/usr/bin/env bash
# Builds the elastream container images from the repository root and prints their sizes:
#
#   operator         elastream-operator:$TAG         images/operator/Dockerfile  (controller + PySpark + a jlink'ed
#                                                                                   Java 17 runtime)
#   operator-python  elastream-operator:$TAG-python  images/operator/Dockerfile --target python (only when named:
#                                                    no JVM, no Spark; for `elastream operator --engine python`)
#   worker           elastream-worker:$TAG           images/worker/Dockerfile    (one node's executors; no Java)
#   redis            elastream-redis:$TAG            images/redis/Dockerfile     (only when named: Debian's Redis
#                                                                                   for the e2e tier)
#
#   scripts/images.sh                                         # operator + worker, FROM python:3.11-slim-bookworm
#   BASE_IMAGE=elastream-base:bookworm scripts/images.sh      # CI: the local base of scripts/docker-setup.sh
#   TAG=0.2.0 scripts/images.sh worker                        # one image, another tag (`make release`: the version)
#   scripts/images.sh operator-python                         # the Spark-free operator image
#
# Environment:
#   TAG         image tag (default: dev, for local builds; scripts/release.sh sets the version)
#   BASE_IMAGE  base of both stages (default: python:3.11-slim-bookworm); any bookworm image with python3 3.11
#               and `python3 -m venv`
#   BUILD_CA    CA bundle for pip in the build stage (default: the `cert` that `pip config list` names on this
#               machine, when there is one); copied to images/certs/build-ca.crt, which git ignores and the final
#               images never contain. BUILD_CA=none builds without one (and removes a copy from an earlier run).
#   SPARK_KEEP  Spark jar groups the operator image keeps although the local analysis does not load them
#               (default: none), e.g. SPARK_KEEP=kubernetes for ELASTREAM_SPARK_MASTER=k8s://...; the groups are
#               hive mllib graphx streaming repl kubernetes yarn mesos rocksdb (docs/images.md)
#
# Builds use the legacy builder (DOCKER_BUILDKIT=0: BuildKit/buildx is not packaged by Debian) and ALWAYS the host
# network: the Docker engine here has no bridge (see scripts/docker-setup.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG="${TAG:-dev}"
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim-bookworm}"
CA_DEST="$ROOT/images/certs/build-ca.crt"

log() { printf '[images] %s\n' "$*"; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not installed (run scripts/docker-setup.sh)"
if ! docker_err=$(docker info 2>&1 >/dev/null); then
    die "the Docker engine is unreachable (run scripts/docker-setup.sh to start one): ${docker_err##*$'\n'}"
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(operator worker)
# image name, Dockerfile directory and build target of a name given on the command line
image_of() {
    case "$1" in operator-python) echo "elastream-operator:$TAG-python" ;; *) echo "elastream-$1:$TAG" ;; esac
}
dir_of() { case "$1" in operator-python) echo operator ;; *) echo "$1" ;; esac; }
target_of() { case "$1" in operator-python) echo python ;; *) echo "" ;; esac; }
for t in "${targets[@]}"; do
    [ -f "$ROOT/images/$(dir_of "$t")/Dockerfile" ] \
        || die "no image '$t' (expected images/$t/Dockerfile, or operator-python)"
done

# The optional build CA (the usual corporate-proxy option, see images/certs/README.md).
pip_cert() {
    local pip
    pip=$(command -v pip3 || command -v pip || true)
    [ -n "$pip" ] || return 0
    # lines look like  global.cert='/etc/ssl/certs/ca-certificates.crt'  or  :env:.cert='...'
    "$pip" config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\{0,1\}\([^']*\)'\{0,1\}$/\1/p" | head -n 1
}
ca="${BUILD_CA-$(pip_cert)}"
if [ "$ca" = "none" ] || [ -z "$ca" ]; then
    rm -f "$CA_DEST"
    log "build CA: none"
elif [ -f "$ca" ]; then
    # copied under a temporary name and renamed: a build running beside this one never sees half a file
    if ! cmp -s "$ca" "$CA_DEST"; then
        cp "$ca" "$CA_DEST.$$.tmp" && mv -f "$CA_DEST.$$.tmp" "$CA_DEST"
    fi
    log "build CA: $ca (copied to images/certs/build-ca.crt; build stage only)"
else
    die "BUILD_CA/pip's cert names $ca, which does not exist"
fi

log "base image: $BASE_IMAGE; tag: $TAG; engine: $(docker version -f '{{.Server.Version}}')"
built=()
for t in "${targets[@]}"; do
    image=$(image_of "$t")
    extra=()
    target=$(target_of "$t")
    [ -z "$target" ] || extra+=(--target "$target")
    if [ "$(dir_of "$t")" = operator ] && [ -n "${SPARK_KEEP:-}" ]; then
        extra+=(--build-arg "SPARK_KEEP=$SPARK_KEEP")
        log "keeping Spark jar groups: $SPARK_KEEP"
    fi
    # one log per run: two runs at once (e.g. a developer and the e2e tier) must not write the same file
    build_log=$(mktemp "${TMPDIR:-/tmp}/elastream-image-$t.XXXXXX")
    log "building $image (log: $build_log, kept when the build fails)"
    start=$(date +%s)
    if ! DOCKER_BUILDKIT=0 docker build \
            --network host \
            --build-arg "BASE_IMAGE=$BASE_IMAGE" \
            ${extra[@]+"${extra[@]}"} \
            -f "$ROOT/images/$(dir_of "$t")/Dockerfile" \
            -t "$image" \
            "$ROOT" >"$build_log" 2>&1; then
        tail -n 30 "$build_log" >&2
        die "building $image failed (full log: $build_log)"
    fi
    rm -f "$build_log"
    log "built $image in $(($(date +%s) - start)) s"
    built+=("$image")
done

log "sizes:"
for image in "${built[@]}"; do
    size=$(docker image inspect -f '{{.Size}}' "$image")
    printf '  %-32s %6d MB\n' "$image" $((size / 1000000))
done
