"""The worker image allow-list (`elastream.core.images`, the chart's worker.allowedImages): which spec.image a
topology may run, and that a refused one is one InvalidSpec line before anything is created."""

from __future__ import annotations

import pytest

from elastream.core.images import image_allowed, image_refusal

ALLOWED = ("registry.example.com/streams/", "ghcr.io/acme/worker", "quay.io/*/elastream-worker:v1.*")


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("registry.example.com/streams/worker:1.0", True),  # under a path ending in /
        ("registry.example.com/streams/team/worker@sha256:abc", True),
        ("registry.example.com/streams/", False),  # the path itself is no image
        ("registry.example.com/streams-evil/worker:1", False),
        ("ghcr.io/acme/worker", True),  # a repository: itself, any tag, any digest
        ("ghcr.io/acme/worker:2.1", True),
        ("ghcr.io/acme/worker@sha256:0123", True),
        ("ghcr.io/acme/worker-evil:2.1", False),  # not a prefix match
        ("ghcr.io/acme/workerx", False),
        ("quay.io/team/elastream-worker:v1.4", True),  # a glob
        ("quay.io/team/elastream-worker:v2.0", False),
        ("elastream-worker:dev", False),  # matched as written: no registry added
    ],
)
def test_what_the_allow_list_admits(image: str, allowed: bool) -> None:
    assert image_allowed(image, ALLOWED) is allowed


def test_an_empty_list_admits_any_image() -> None:
    assert image_allowed("anything.example/at:all", ())


def test_the_refusal_is_one_line_naming_the_image_and_the_list() -> None:
    line = image_refusal("evil.example/miner:1", ALLOWED)
    assert "\n" not in line and line.startswith("spec.image: 'evil.example/miner:1' is not an allowed worker image")
    assert all(entry in line for entry in ALLOWED)


def test_worker_pods_get_the_pull_policy_and_pull_secrets() -> None:
    from elastream.control.backends.worker_objects import WorkerPodSettings, worker_pod
    from elastream.core.topology import parse_manifest
    from support.manifests import edge, manifest, sink, src

    topology = parse_manifest(manifest([src("s", 1), sink("z", 1)], [edge("s", "z")], name="web", nodes=1))
    settings = WorkerPodSettings(image_pull_policy="Always", image_pull_secrets=("regcred", "mirror"))
    pod = worker_pod(topology, "node-0", {"name": "web", "uid": "u"}, settings)
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert (
        "imagePullSecrets"
        not in worker_pod(topology, "node-0", {"name": "web", "uid": "u"}, WorkerPodSettings())["spec"]
    )
