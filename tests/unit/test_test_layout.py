"""The test tiers' own layout: lane 1 collects tests/unit and tests/integration in one pytest process, which
imports test modules by basename (the directories are not packages), so a basename in both tiers stops the
whole lane's collection ("import file mismatch") although each file passes alone."""

from __future__ import annotations

import collections
import os

from support.paths import REPO


def test_no_test_module_basename_is_in_both_tiers_of_one_lane() -> None:
    seen: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
    for tier in ("unit", "integration"):
        for name in os.listdir(os.path.join(REPO, "tests", tier)):
            if name.endswith(".py") and name != "__init__.py":
                seen[name].append(tier)
    assert {name: tiers for name, tiers in seen.items() if len(tiers) > 1} == {}
