"""Rolling a topology back to its last periodic checkpoint, in place: what a dead worker, an aborted migration
that lost one, and a partial migration that failed after COMMIT come to (`control.migration`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from elastream.core.migration_protocol import MigrationReport
from elastream.core.status import EventReason

if TYPE_CHECKING:
    from elastream.control.migration import MigrationDriver


def recover_from_failure(driver: MigrationDriver, failed: dict[str, str]) -> MigrationReport | None:
    """Workers died (`failed`: node -> why). With a periodic checkpoint, roll the whole topology back to it
    in place: dead nodes start again, survivors reload their executors from it, sources replay what came
    after it (counted as `replayed`), so nothing is lost. Without one, restart the dead workers empty and
    say what was lost (returns None)."""
    if driver.store.latest_checkpoint() is not None:
        return roll_back(driver)
    nodes = sorted(failed)
    driver.backend.restart_nodes(nodes)
    driver.events.emit(
        EventReason.WORKERS_RESTARTED,
        f"restarted {', '.join(nodes)} empty ({'; '.join(failed.values())}); no periodic checkpoint to roll back "
        "to, so the events and state the dead workers held are lost",
        True,
    )
    return None


def roll_back(driver: MigrationDriver) -> MigrationReport:
    """Roll the whole topology back to the last periodic checkpoint in place (`restart`, reloading the
    surviving workers): state from the checkpoint, the sources replaying what came after it."""
    rollback = replace(driver, protocol="restart", in_place=True, before_action=None)
    return rollback.migrate(driver.backend.current_schedule())
