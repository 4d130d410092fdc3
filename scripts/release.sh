#!/usr/bin/env bash
# Builds the release artifacts of the version in operator/src/elastream/__init__.py (`__version__`, the one
# place it is written: docs/versioning.md) into dist/:
#
#   dist/elastream-<v>.tgz                   the Helm chart (`helm package charts/elastream`)
#   dist/elastream-operator-<v>.tar.gz       `docker save elastream-operator:<v> | gzip`
#   dist/elastream-worker-<v>.tar.gz         `docker save elastream-worker:<v> | gzip`
#   dist/SHA256SUMS                          sha256sum of each of them, written last (`cd dist && sha256sum -c SHA256SUMS`)
#
#   make release                             # the same as: bash scripts/release.sh
#   docker load -i dist/elastream-worker-0.2.0.tar.gz        # on the machine that runs them, or push them:
#   docker tag elastream-worker:0.2.0 registry.example.com/elastream-worker:0.2.0
#
# It refuses, before building anything, when:
#   - the working tree is not clean (tracked changes or untracked files that are not ignored): the artifacts
#     must be those of a commit, which it prints;
#   - charts/elastream/Chart.yaml's version or appVersion is not the package's version;
#   - CHANGELOG.md has no section `## [<v>]` (a section still dated `unreleased` is only warned about: date it,
#     `## [<v>] - YYYY-MM-DD`, in the commit you publish);
# and after packaging the chart, when the chart installed with its defaults would not run the images of <v>.
#
# Environment:
#   RELEASE_SKIP_IMAGES=1  build no images and save none: only the chart and SHA256SUMS (for the unit test and
#                          machines without a Docker engine; the output says it is not a complete release)
#   RELEASE_DIST           the output directory (default: dist/ in the repository, which git ignores)
#   ELASTREAM_HELM         the helm binary (default: helm on PATH, else the newest build in
#                          ${ELASTREAM_TOOLS_CACHE:-~/.cache/elastream/tools}/*/bin/helm, else one is built with
#                          scripts/k8s-tools.sh helm: a few minutes, Go needed)
#   BASE_IMAGE, BUILD_CA, SPARK_KEEP   passed on to scripts/images.sh (see there)
#
# The images are built by scripts/images.sh with TAG=<v> (`make images` keeps building :dev for local work).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIST="${RELEASE_DIST:-$ROOT/dist}"

log() { printf '[release] %s\n' "$*" >&2; }
die() { printf '[release] ERROR: %s\n' "$*" >&2; exit 1; }

cd "$ROOT"

# ---- the version, and everything that must agree with it ------------------------------------------------------
VERSION=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' operator/src/elastream/__init__.py)
[ -n "$VERSION" ] || die "no __version__ = \"X.Y.Z\" line in operator/src/elastream/__init__.py"
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]] \
    || die "__version__ '$VERSION' is not a SemVer version (X.Y.Z)"

chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" charts/elastream/Chart.yaml; }
for field in version appVersion; do
    value=$(chart_field "$field")
    [ "$value" = "$VERSION" ] || die "charts/elastream/Chart.yaml: $field is '$value', the package is $VERSION" \
        "(operator/src/elastream/__init__.py); set both version and appVersion to $VERSION"
done

heading=$(grep -m 1 -E "^## \[${VERSION//./\\.}\]" CHANGELOG.md || true)
[ -n "$heading" ] || die "CHANGELOG.md has no section for $VERSION: add '## [$VERSION] - YYYY-MM-DD' below" \
    "'## [Unreleased]' with what this version changes (move the Unreleased lines into it)"
if ! [[ "$heading" =~ \ -\ [0-9]{4}-[0-9]{2}-[0-9]{2}$ ]]; then
    log "WARNING: CHANGELOG.md's '$heading' has no date: date it ('## [$VERSION] - YYYY-MM-DD') in the commit" \
        "you publish"
fi

# ---- a clean working tree: the artifacts are a commit's ----------------------------------------------------------
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "$ROOT is not a git working tree"
dirty=$(git status --porcelain --untracked-files=normal)
if [ -n "$dirty" ]; then
    printf '%s\n' "$dirty" | head -n 20 | sed 's/^/    /' >&2
    die "the working tree is not clean (above, at most 20 lines): commit or remove the changes, then run again"
fi
COMMIT=$(git rev-parse --short=12 HEAD)

# ---- the tools --------------------------------------------------------------------------------------------------
find_helm() {  # as tests/unit/test_chart.py's find_helm: $ELASTREAM_HELM, helm on PATH, the newest cached build
    if [ -n "${ELASTREAM_HELM:-}" ]; then
        [ -x "$ELASTREAM_HELM" ] || die "ELASTREAM_HELM=$ELASTREAM_HELM is not an executable"
        echo "$ELASTREAM_HELM"
        return
    fi
    if command -v helm >/dev/null 2>&1; then
        command -v helm
        return
    fi
    local cache="${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}" built
    built=$(ls -t "$cache"/*/bin/helm 2>/dev/null | head -n 1 || true)
    if [ -n "$built" ]; then
        echo "$built"
        return
    fi
    log "no helm: building it with scripts/k8s-tools.sh helm (a few minutes)"
    echo "$(bash "$ROOT/scripts/k8s-tools.sh" helm | tail -n 1)/helm"
}
HELM=$(find_helm)

skip_images="${RELEASE_SKIP_IMAGES:-0}"
if [ "$skip_images" != 1 ]; then
    command -v docker >/dev/null 2>&1 || die "docker is not installed (run scripts/docker-setup.sh), or set" \
        "RELEASE_SKIP_IMAGES=1 for the chart alone"
    docker info >/dev/null 2>&1 || die "the Docker engine is unreachable (scripts/docker-setup.sh starts one), or" \
        "set RELEASE_SKIP_IMAGES=1 for the chart alone"
fi

# ---- the artifacts ----------------------------------------------------------------------------------------------
log "elastream $VERSION from commit $COMMIT into $DIST"
started=$(date +%s)
mkdir -p "$DIST"
chart="elastream-$VERSION.tgz"
images=(operator worker)
artifacts=("$chart")
# the checksum file says the set is complete: it goes first and comes back last
rm -f "$DIST/SHA256SUMS" "$DIST/$chart"
for name in "${images[@]}"; do rm -f "$DIST/elastream-$name-$VERSION.tar.gz"; done

"$HELM" package charts/elastream -d "$DIST" >/dev/null
[ -f "$DIST/$chart" ] || die "helm package wrote no $DIST/$chart"
# installed with its defaults, the packaged chart must run the images of this release, not :dev
rendered=$("$HELM" template elastream "$DIST/$chart") || die "helm template of $DIST/$chart failed (above)"
for image in "elastream-operator:$VERSION" "elastream-worker:$VERSION"; do
    if ! grep -q "\"$image\"" <<<"$rendered"; then
        rm -f "$DIST/$chart"
        die "the chart's defaults do not run $image (they name: $(grep -o '"elastream-[a-z]*:[^"]*"' \
            <<<"$rendered" | sort -u | tr '\n' ' ')): leave operator.image.tag and worker.image.tag empty in" \
            "charts/elastream/values.yaml (the chart's appVersion)"
    fi
done
log "chart: $chart (its defaults run elastream-operator:$VERSION and elastream-worker:$VERSION)"

if [ "$skip_images" = 1 ]; then
    log "images skipped (RELEASE_SKIP_IMAGES=1): not a complete release, only the chart and its checksum"
else
    TAG="$VERSION" bash "$ROOT/scripts/images.sh" "${images[@]}"
    for name in "${images[@]}"; do
        image="elastream-$name:$VERSION"
        file="elastream-$name-$VERSION.tar.gz"
        log "saving $image to $file"
        # gzip -n: no name or time in the header, so the same image gives the same bytes
        docker save "$image" | gzip -n >"$DIST/$file.partial"
        mv -f "$DIST/$file.partial" "$DIST/$file"
        artifacts+=("$file")
    done
fi

(cd "$DIST" && sha256sum "${artifacts[@]}" >SHA256SUMS.partial && mv -f SHA256SUMS.partial SHA256SUMS)
log "done in $(($(date +%s) - started)) s:"
for file in "${artifacts[@]}" SHA256SUMS; do
    printf '  %-40s %12d bytes\n' "$file" "$(stat -c %s "$DIST/$file")" >&2
done
