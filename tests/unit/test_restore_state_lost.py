"""A resume whose checkpoint no longer holds its state (the restore's check raises StateLost, as
`MigrationDriver.migrate` does for `restart`) is Stalled/StateLost with one StateLost event however many
passes retry it, and nothing is started empty; the in-memory world of test_reconciler.py."""

from __future__ import annotations

from test_reconciler import suspended

from elastream.core.ports import StateLost


def test_a_resume_whose_checkpoint_lost_its_state_is_state_lost_with_one_event_and_starts_nothing() -> None:
    world = suspended(3)
    lost = "checkpoint ckpt-1, the latest, no longer holds what it held when it completed (the state of c is gone)"

    def restore_finds_the_state_gone(failed):
        raise StateLost(lost)

    world.migrator.recover = restore_finds_the_state_gone  # type: ignore[method-assign]
    started = len(world.backend.started)
    world.patch_spec(suspend=False)
    world.run_for(60.0)  # several passes retry the resume
    assert world.condition("Stalled")["reason"] == "StateLost"
    assert lost in world.condition("Stalled")["message"]
    assert world.reasons().count("StateLost") == 1
    assert world.pods == set() and len(world.backend.started) == started  # nothing started empty
