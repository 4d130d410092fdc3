#!/usr/bin/env bash
# Builds the elastream container images from the repository root and prints their sizes:
#
#   elastream-operator:$TAG   images/operator/Dockerfile  (controller + PySpark + headless JRE 17)
#   elastream-worker:$TAG     images/worker/Dockerfile    (one node's executors; no Java, no Spark)
#   elastream-redis:$TAG      images/redis/Dockerfile     (only when named: Debian's Redis for the e2e tier)
#
#   scripts/images.sh                                         # FROM python:3.11-slim-bookworm (pulled)
#   BASE_IMAGE=elastream-base:bookworm scripts/images.sh      # CI: the local base of scripts/docker-setup.sh
#   TAG=0.1.0 scripts/images.sh worker                        # one image, another tag
#
# Environment:
#   TAG         image tag (default: dev)
#   BASE_IMAGE  base of both stages (default: python:3.11-slim-bookworm); any bookworm image with python3 3.11
#               and `python3 -m venv`
#   BUILD_CA    CA bundle for pip in the build stage (default: the `cert` that `pip config list` names on this
#               machine, when there is one); copied to images/certs/build-ca.crt, which git ignores and the final
#               images never contain. BUILD_CA=none builds without one (and removes a copy from an earlier run).
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
for t in "${targets[@]}"; do
    [ -f "$ROOT/images/$t/Dockerfile" ] || die "no image '$t' (expected images/$t/Dockerfile)"
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
    image="elastream-$t:$TAG"
    # one log per run: two runs at once (e.g. a developer and the e2e tier) must not write the same file
    build_log=$(mktemp "${TMPDIR:-/tmp}/elastream-image-$t.XXXXXX")
    log "building $image (log: $build_log, kept when the build fails)"
    start=$(date +%s)
    if ! DOCKER_BUILDKIT=0 docker build \
            --network host \
            --build-arg "BASE_IMAGE=$BASE_IMAGE" \
            -f "$ROOT/images/$t/Dockerfile" \
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
