"""One version everywhere (docs/versioning.md): elastream.__version__ is the one place it is written; the
distribution reads it, and the chart, the CHANGELOG, the image labels and the default worker image must agree.
Then scripts/release.sh's refusals and its checksum file, without Docker (RELEASE_SKIP_IMAGES=1)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from test_chart import find_helm  # $ELASTREAM_HELM, helm on PATH, or a scripts/k8s-tools.sh build

import elastream
from elastream import DEFAULT_WORKER_IMAGE, __version__
from elastream.cli import build_parser
from elastream.control.backends.worker_objects import WorkerPodSettings
from elastream.control.operator_options import OperatorOptions

REPO = Path(__file__).resolve().parents[2]
#: SemVer 2.0.0's own pattern (semver.org), anchored
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
#: a version heading of CHANGELOG.md: `## [0.2.0] - 2026-12-01` (or `- unreleased` until it is cut)
VERSION_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+))?$", re.MULTILINE)


def changelog_versions() -> list[str]:
    return [m["version"] for m in VERSION_HEADING.finditer((REPO / "CHANGELOG.md").read_text())]


def test_the_version_is_semver() -> None:
    assert SEMVER.match(__version__), f"elastream.__version__ {__version__!r} is not SemVer"


def test_the_distribution_reads_the_version_from_the_package() -> None:
    with open(REPO / "operator" / "pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    assert "version" not in pyproject["project"], "pyproject.toml must not write the version: it reads it"
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "elastream.__version__"}
    # setuptools reads the attribute statically: it must be a plain string constant in the package's __init__
    source = (REPO / "operator" / "src" / "elastream" / "__init__.py").read_text()
    assert re.search(rf'^__version__ = "{re.escape(__version__)}"$', source, re.MULTILINE)


def test_the_chart_version_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "elastream" / "Chart.yaml").read_text())
    assert chart["version"] == __version__
    # quoted in Chart.yaml, as Helm recommends: an unquoted 1.10 would be read as the number 1.1
    assert chart["appVersion"] == __version__ and isinstance(chart["appVersion"], str)


def test_the_changelog_has_unreleased_on_top_then_this_version() -> None:
    versions = changelog_versions()
    assert versions[:2] == ["Unreleased", __version__], (
        f"CHANGELOG.md's sections are {versions[:3]}...: it must begin with [Unreleased] and then the newest "
        f"release, [{__version__}] (elastream.__version__)"
    )
    assert len(versions) == len(set(versions)), f"a version has two sections: {versions}"


def test_the_images_are_labelled_with_the_version() -> None:
    for dockerfile in ("images/operator/Dockerfile", "images/worker/Dockerfile"):
        labels = re.findall(r'org\.opencontainers\.image\.version="([^"]*)"', (REPO / dockerfile).read_text())
        assert labels and set(labels) == {__version__}, f"{dockerfile}: image.version labels {labels}"


def test_the_default_worker_image_is_this_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert f"elastream-worker:{__version__}" == DEFAULT_WORKER_IMAGE
    assert WorkerPodSettings().image == DEFAULT_WORKER_IMAGE
    assert OperatorOptions(redis_url="redis://127.0.0.1:6379/0").worker.image == DEFAULT_WORKER_IMAGE
    # the CLI's default is read when the parser is built: without $ELASTREAM_WORKER_IMAGE it is the constant
    monkeypatch.delenv("ELASTREAM_WORKER_IMAGE", raising=False)
    args = build_parser().parse_args(["operator"])
    assert args.worker_image == DEFAULT_WORKER_IMAGE


def test_elastream_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"elastream {elastream.__version__}"


# ---- scripts/release.sh ------------------------------------------------------------------------------------


def release_repo(tmp_path: Path) -> Path:
    """A git repository holding what scripts/release.sh reads (its own copy of the script, the chart, the
    CHANGELOG, the package's __init__, the image scripts), committed: a clean working tree."""
    repo = tmp_path / "repo"
    for part in ("scripts/release.sh", "scripts/images.sh", "CHANGELOG.md", "operator/src/elastream/__init__.py"):
        (repo / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / part, repo / part)
    shutil.copytree(REPO / "charts" / "elastream", repo / "charts" / "elastream")
    (repo / ".gitignore").write_text("dist/\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "release fixture")
    return repo


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def release(repo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    helm = find_helm()
    return subprocess.run(
        ["bash", str(repo / "scripts" / "release.sh")],
        cwd=repo,
        env={**os.environ, "RELEASE_SKIP_IMAGES": "1", **({"ELASTREAM_HELM": helm} if helm else {}), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_release_refuses_a_dirty_working_tree(tmp_path: Path) -> None:
    repo = release_repo(tmp_path)
    (repo / "CHANGELOG.md").write_text((repo / "CHANGELOG.md").read_text() + "\n- an uncommitted line\n")
    (repo / "stray.txt").write_text("not committed either\n")
    done = release(repo)
    assert done.returncode != 0
    assert "working tree is not clean" in done.stderr
    assert "CHANGELOG.md" in done.stderr and "stray.txt" in done.stderr
    assert not (repo / "dist").exists()


def test_release_refuses_a_version_without_a_changelog_section(tmp_path: Path) -> None:
    repo = release_repo(tmp_path)
    changelog = repo / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(f"## [{__version__}]", "## [0.0.9]"))
    git(repo, "commit", "-q", "-am", "no section for the version")
    done = release(repo)
    assert done.returncode != 0
    assert f"CHANGELOG.md has no section for {__version__}" in done.stderr
    assert f"## [{__version__}] - YYYY-MM-DD" in done.stderr  # the fix, spelled out
    assert not (repo / "dist").exists()


def test_release_refuses_a_chart_of_another_version(tmp_path: Path) -> None:
    repo = release_repo(tmp_path)
    chart = repo / "charts" / "elastream" / "Chart.yaml"
    chart.write_text(chart.read_text().replace(f'appVersion: "{__version__}"', 'appVersion: "9.9.9"'))
    git(repo, "commit", "-q", "-am", "another appVersion")
    done = release(repo)
    assert done.returncode != 0
    assert "appVersion" in done.stderr and "9.9.9" in done.stderr and __version__ in done.stderr


def test_release_refuses_a_chart_whose_defaults_run_other_images(tmp_path: Path) -> None:
    if find_helm() is None:
        pytest.fail("no helm binary (see tests/unit/test_chart.py: scripts/k8s-tools.sh helm)", pytrace=False)
    repo = release_repo(tmp_path)
    values = repo / "charts" / "elastream" / "values.yaml"
    # operator.image.tag and worker.image.tag (the only keys `tag` at that depth) pinned to the local builds' tag
    pinned, count = re.subn(r"(?m)^    tag: .*$", "    tag: dev", values.read_text())
    assert count == 2
    values.write_text(pinned)
    git(repo, "commit", "-q", "-am", "images pinned to dev")
    done = release(repo)
    assert done.returncode != 0
    assert f"the chart's defaults do not run elastream-operator:{__version__}" in done.stderr
    assert '"elastream-operator:dev"' in done.stderr  # what they do run
    assert not (repo / "dist" / "SHA256SUMS").exists() and not (repo / "dist" / f"elastream-{__version__}.tgz").exists()


def test_release_packages_the_chart_and_writes_checksums(tmp_path: Path) -> None:
    if find_helm() is None:
        pytest.fail("no helm binary (see tests/unit/test_chart.py: scripts/k8s-tools.sh helm)", pytrace=False)
    repo = release_repo(tmp_path)
    done = release(repo)
    assert done.returncode == 0, done.stderr
    dist = repo / "dist"
    chart = f"elastream-{__version__}.tgz"
    assert sorted(p.name for p in dist.iterdir()) == sorted([chart, "SHA256SUMS"])
    # `sha256sum -c SHA256SUMS` in dist/ verifies it: "<hex>  <file name>" per artifact
    lines = (dist / "SHA256SUMS").read_text().splitlines()
    assert lines == [f"{hashlib.sha256((dist / chart).read_bytes()).hexdigest()}  {chart}"]
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # the images were skipped, and the script says so rather than passing for a whole release
    assert "RELEASE_SKIP_IMAGES=1" in done.stderr and "not a complete release" in done.stderr
    # the packaged chart is the chart of this version
    listing = subprocess.run(["tar", "-xzOf", str(dist / chart), "elastream/Chart.yaml"], capture_output=True)
    assert yaml.safe_load(listing.stdout)["appVersion"] == __version__
