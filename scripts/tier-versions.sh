#!/usr/bin/env bash
# One line naming what the test tiers run against: the Kubernetes and Helm versions scripts/k8s-tools.sh builds
# (cached or to be built), the Docker engine (running, installed, or to be installed by scripts/docker-setup.sh).
# .ci/run prints it first, so a CI log says at its top what the e2e tier used.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
eval "$(grep -E '^(K8S|ETCD|HELM)_VERSION=' "$ROOT/scripts/k8s-tools.sh")"
cache="${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}/bin"
if [ -x "$cache/kube-apiserver" ] && [ -x "$cache/kube-scheduler" ] && [ -x "$cache/helm" ]; then tools="cached"; else tools="built from Go modules on first use, ~30 min"; fi
if engine=$(docker version -f '{{.Server.Version}}' 2>/dev/null); then
    docker="Docker engine $engine"
elif command -v dockerd >/dev/null 2>&1; then
    docker="Docker engine $(dockerd --version 2>/dev/null | sed 's/^Docker version \([^,]*\).*/\1/') (started by scripts/docker-setup.sh)"
else
    docker="Debian's docker.io (installed by scripts/docker-setup.sh)"
fi
echo "elastream test tiers: unit; integration (real Redis, local Spark); e2e: Kubernetes ${K8S_VERSION} (kube-apiserver, etcd ${ETCD_VERSION}, kube-controller-manager, kube-scheduler with 3 nodes x 4 CPU; ${tools}), ${docker}, Helm ${HELM_VERSION}"
