#!/usr/bin/env bash
# Makes a Docker engine and a local base image ready for `scripts/images.sh`, on a machine with no container
# registry. Idempotent: every step is skipped when its result is already there, so CI can call it every run.
#
#   scripts/docker-setup.sh && BASE_IMAGE=elastream-base:bookworm scripts/images.sh
#
# Steps (one progress line each, with the elapsed time):
#   1. install Debian's docker.io and debootstrap with apt-get when `dockerd` / `debootstrap` are missing;
#   2. start dockerd when `docker info` fails, ALWAYS with --bridge=none --iptables=false --ip-masq=false: the
#      default bridge would put 172.17.0.0/16 on the machine, a private range no traffic of ours may go to.
#      Every build and container must use `--network host`. Data root: ${ELASTREAM_DOCKER_ROOT:-/var/lib/docker};
#      log: /tmp/elastream-dockerd.log;
#   3. make the base image elastream-base:bookworm when it is missing: `debootstrap --variant=minbase bookworm`
#      with python3, python3-venv and python3-pip from the mirror apt uses here, then `docker import`. The rootfs
#      tarball is cached as ${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}/base-bookworm.tar, so a
#      new Docker data root re-imports it (seconds) instead of bootstrapping again (about a minute).
# Needs root (or sudo) for apt-get, dockerd and debootstrap.
set -euo pipefail

BASE_TAG="${ELASTREAM_BASE_IMAGE:-elastream-base:bookworm}"
SUITE=bookworm
DOCKER_ROOT="${ELASTREAM_DOCKER_ROOT:-/var/lib/docker}"
DOCKERD_LOG=/tmp/elastream-dockerd.log
CACHE_ROOT="${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}"
BASE_TAR="$CACHE_ROOT/base-$SUITE.tar"
BASE_PACKAGES=python3,python3-venv,python3-pip

START=$(date +%s)
step() { printf '[docker-setup +%3ds] %s\n' "$(($(date +%s) - START))" "$*"; }
die() { printf '[docker-setup +%3ds] ERROR: %s\n' "$(($(date +%s) - START))" "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "needs root (or sudo) for apt-get, dockerd and debootstrap"
    SUDO="sudo"
fi

# The Debian mirror apt uses on this machine (deb822 .sources files or one-line .list entries), for debootstrap.
apt_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822 stanzas are separated by blank lines; take the first URIs of a stanza whose Suites has $SUITE.
        uri=$(awk -v suite="$SUITE" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uris = ""; ok = 0; deb = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^[Uu][Rr][Ii][Ss]:/) { sub(/^[^:]*:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
                    if ($i ~ /^[Ss]uites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
                    if ($i ~ /^[Tt]ypes:.*(^|[ \t])deb([ \t]|$)/) deb = 1
                }
                if (ok && deb && uris != "") { print uris; exit }
            }' "$f")
        if [ -n "$uri" ]; then echo "${uri%/}"; return; fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [options] URI SUITE COMPONENTS...
        uri=$(awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }' "$f")
        if [ -n "$uri" ]; then echo "${uri%/}"; return; fi
    done
    echo "http://deb.debian.org/debian"
}

# 1. packages ------------------------------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} with apt-get"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    step "installed ${missing[*]}"
else
    step "dockerd and debootstrap are installed"
fi

# 2. engine --------------------------------------------------------------------------------------------------
if docker info >/dev/null 2>&1; then
    step "Docker engine is running"
else
    step "starting dockerd (no bridge, no iptables; data root $DOCKER_ROOT; log $DOCKERD_LOG)"
    $SUDO mkdir -p "$DOCKER_ROOT"
    # setsid + nohup: the engine outlives this script and its shell session.
    $SUDO setsid nohup dockerd \
        --bridge=none --iptables=false --ip-masq=false \
        --data-root "$DOCKER_ROOT" \
        >>"$DOCKERD_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        if docker info >/dev/null 2>&1; then break; fi
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || die "dockerd did not come up within 60 s; see $DOCKERD_LOG"
    step "dockerd is up"
fi

# 3. base image ----------------------------------------------------------------------------------------------
# docker import sets no environment: give the image the PATH, locale and command the official images have, so a
# Dockerfile's `ENV PATH=/opt/elastream/bin:$PATH` extends a real PATH.
import_base() {
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        --message "debootstrap --variant=minbase $SUITE + $BASE_PACKAGES" \
        - "$BASE_TAG" >/dev/null
}

if docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    step "base image $BASE_TAG exists"
else
    if [ ! -s "$BASE_TAR" ]; then
        mirror=$(apt_mirror)
        step "bootstrapping $SUITE (minbase + $BASE_PACKAGES) from $mirror"
        mkdir -p "$CACHE_ROOT"
        rootfs=$(mktemp -d "${TMPDIR:-/tmp}/elastream-rootfs.XXXXXX")
        trap '$SUDO rm -rf "$rootfs"' EXIT
        $SUDO debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$mirror" \
            >/tmp/elastream-debootstrap.log 2>&1 \
            || die "debootstrap failed; see /tmp/elastream-debootstrap.log"
        # Trim what an image does not need: apt lists and caches (apt-get update refills them in a build).
        $SUDO rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
        # Written under a temporary name and renamed, so an interrupted run never leaves a truncated cache.
        $SUDO tar -C "$rootfs" --numeric-owner -cf "$BASE_TAR.tmp" .
        mv "$BASE_TAR.tmp" "$BASE_TAR"
        $SUDO rm -rf "$rootfs"
        trap - EXIT
        step "cached the rootfs as $BASE_TAR ($(du -h "$BASE_TAR" | cut -f1))"
    fi
    step "importing $BASE_TAR as $BASE_TAG"
    import_base <"$BASE_TAR"
    step "base image $BASE_TAG imported ($(docker image inspect -f '{{.Size}}' "$BASE_TAG" | awk '{printf "%.0f MB", $1 / 1e6}'))"
fi

echo "docker: $(docker version -f '{{.Server.Version}}')"
