"""What a scaling, migration or recovery came to, and which way a scaling went: enums, so a typo is a type
error and the values are the strings the status and the metrics have always shown."""

from __future__ import annotations

import enum


class Direction(enum.StrEnum):
    OUT = "out"
    IN = "in"
    NONE = "none"


class Outcome(enum.StrEnum):
    #: a scaling not carried out yet
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    #: a migration that stopped before COMMIT completed, or went back to the old schedule
    ABORTED = "aborted"
    FAILED = "failed"
    #: a scaling whose plan changed nothing
    UNCHANGED = "unchanged"
    #: a recovery without a checkpoint: the dead workers restarted empty
    RESTARTED = "restarted"
