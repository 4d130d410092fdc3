"""`core.upgrade.spec_change`: which spec changes a running schedule takes in place, which rebuild the operator's
side only, which need a checkpoint and new pods, and which no checkpoint can carry."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from elastream.core.topology import parse_manifest
from elastream.core.upgrade import spec_change
from support.manifests import edge, manifest, sink, src, work


def base() -> dict[str, Any]:
    return manifest(
        [src("s", 2), {**work("count", 2), "stateful": True}, sink("z", 1)],
        [edge("s", "count", "fields", key="k"), edge("count", "z")],
        image="elastream-worker:1",
    )


def change(edit: Any) -> Any:
    wanted = copy.deepcopy(base())
    edit(wanted["spec"])
    return spec_change(parse_manifest(base()), parse_manifest(wanted))


def test_nodes_parallelism_auto_and_suspend_apply_in_place() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["nodes"] = 4
        spec["vertices"][1]["parallelism"] = 3
        spec["scaling"] = {"auto": {"enabled": True, "minNodes": 1, "maxNodes": 5}}
        spec["suspend"] = False

    found = change(edit)
    assert found.restart == () and found.controller == () and found.refused == ()
    assert not found.needs_restart


def test_an_unchanged_spec_is_no_change_and_null_is_absent() -> None:
    assert change(lambda spec: None) == spec_change(parse_manifest(base()), parse_manifest(base()))
    assert change(lambda spec: spec.update(resources=None)).restart == ()


def test_image_resources_placement_and_user_code_restart() -> None:
    assert change(lambda spec: spec.update(image="elastream-worker:2")).restart == ("spec.image",)
    assert change(lambda spec: spec.update(resources={"cpu": "2"})).restart == ("spec.resources",)
    assert change(lambda spec: spec.update(slotsPerNode=9)).restart == ("spec.slotsPerNode",)
    found = change(lambda spec: spec["vertices"][1]["logic"].update(costMs=3))
    assert found.restart == ("spec.vertices[count].logic",) and found.added == found.removed == ()


def test_a_stream_change_restarts() -> None:
    found = change(lambda spec: spec["streams"][1].update(grouping="fields", key="k"))
    assert found.restart == ("spec.streams",)


def test_scaling_settings_other_than_auto_rebuild_the_operator_side_only() -> None:
    found = change(lambda spec: spec.update(scaling={"checkpointIntervalSeconds": 5, "window": 4}))
    assert found.controller == ("spec.scaling.checkpointIntervalSeconds", "spec.scaling.window")
    assert found.restart == ()


def test_vertices_added_and_removed_are_named_for_their_state() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["vertices"][1] = {**work("tally", 2), "stateful": True}
        spec["streams"] = [edge("s", "tally", "fields", key="k"), edge("tally", "z")]

    found = change(edit)
    assert found.added == ("tally",) and found.removed == ("count",)
    assert found.needs_restart and "spec.vertices (added or removed)" in found.restart
    assert "tally" in found.describe() and "count" in found.describe() and "dropped" in found.describe()


def test_a_kept_stateful_vertex_or_source_cannot_change_its_key_groups() -> None:
    found = change(lambda spec: spec["vertices"][1].update(maxParallelism=64))
    assert len(found.refused) == 1
    assert found.refused[0].startswith("spec.vertices[1].maxParallelism: 128 → 64")
    assert "rename the vertex" in found.refused[0]
    assert (
        change(lambda spec: spec["vertices"][0].update(maxParallelism=32))
        .refused[0]
        .startswith("spec.vertices[0].maxParallelism")
    )
    # a stateless vertex in the middle holds nothing keyed: its key space may change (with a restart)
    stateless = change(lambda spec: spec["vertices"][2].update(maxParallelism=8))
    assert stateless.refused == () and stateless.restart == ("spec.vertices[z].maxParallelism",)


@given(
    nodes=st.integers(2, 6),
    degree=st.integers(1, 8),
    image=st.sampled_from(["elastream-worker:1", "elastream-worker:2"]),
)
def test_a_restart_is_needed_exactly_when_a_field_outside_the_in_place_ones_changed(
    nodes: int, degree: int, image: str
) -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec.update(nodes=nodes, image=image)
        spec["vertices"][1]["parallelism"] = degree

    assert change(edit).needs_restart == (image != "elastream-worker:1")
