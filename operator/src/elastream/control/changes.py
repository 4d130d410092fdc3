"""What the controller's parts hand back to it: the one settle rule, and the events they have to say.

The drains (`control.controller_drains.DrainRunner`) and the autoscaler (`control.autoscaler.Autoscaler`)
change nothing of the controller themselves: they return an outcome, which `TopologyController` applies in
one path. A schedule change is applied there by `settles_at`: the analysis skips the samples of the switch
and of the first catch-up, so it takes none before `SETTLE_INTERVALS` intervals after the change.
"""

from __future__ import annotations

from typing import NamedTuple

#: intervals after a schedule change whose samples the analysis skips (the switch and the first catch-up)
SETTLE_INTERVALS = 2


def settles_at(changed_at: float, interval_s: float) -> float:
    """The first moment whose samples the analysis takes after the schedule changed at `changed_at`."""
    return changed_at + SETTLE_INTERVALS * interval_s


class Said(NamedTuple):
    """An event a part of the controller has to say (`EventSink.emit`'s arguments), said by the controller
    when it applies the part's outcome, in order with what else that outcome changes."""

    reason: str
    message: str
    warning: bool = False
