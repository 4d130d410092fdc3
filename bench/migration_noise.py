"""The noise floor of the migration benchmark's goals: the same runs with no rescale at the request.

`bench/migration.py` reads each run's 10 s after the rescale request against the 5 s before it: the worst
100 ms bucket's p99 against the steady p99 (goal: ≤ 2×), the lowest bucket's throughput against the steady
throughput (goal: ≥ 0.9). Its steady window's own worst bucket is a noise floor, but of 50 buckets, where the
goals read the worst of 100. This benchmark runs each DAG and direction with nothing requested at that
time (`migration.NO_RESCALE`: the old schedule runs on) alternated with a `keyGroups` rescale, and reads the
same figures over the same windows: how often the goals hold on this machine when nothing happens at all,
beside how often they hold through a rescale. It also reads the host's CPU (busy share of all cores, and
what a hypervisor stole) in the window before and after the request.

    python bench/migration_noise.py [--runs 5] [--dags ccr-star,ccr-diamond] [--out docs/benchmarks]

Writes migration-noise.md to `--out`. Each run takes about 25 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import migration  # the benchmark beside this file (it puts the package and tests/support on the path)
from latency import AFTER_S, P99_TARGET, STEADY_S, THROUGHPUT_TARGET

LABELS = (migration.NO_RESCALE, "ccr-keygroups")


def cell_rows(runs: list[dict[str, Any]]) -> list[str]:
    """Per DAG and direction, for each label: runs meeting each goal, median ratios, median host CPU."""
    lines = [
        "| DAG | direction | requested | p99 ≤ 2× in | median p99 ratio | worst 100 ms ≥ 0.9 in | median worst 100 ms "
        "| host CPU before → after (median) | steal after (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cells = sorted({(r["dag"], r["direction"]) for r in runs}, key=lambda c: (c[0], c[1] != "out"))
    for dag, direction in cells:
        for protocol in LABELS:
            mine = [r for r in runs if (r["dag"], r["direction"], r["protocol"]) == (dag, direction, protocol)]
            if not mine:
                continue
            felt = [r["latency"] for r in mine]
            p99 = [f.p99_ratio for f in felt if f.p99_ratio is not None]
            worst = [f.throughput_ratio for f in felt if f.throughput_ratio is not None]
            what = "nothing" if protocol == migration.NO_RESCALE else "keyGroups rescale"
            lines.append(
                f"| {dag} | {direction} | {what} | {sum(f.p99_met is True for f in felt)} of {len(mine)} "
                f"| {migration.fmt2(migration.median(p99))}× "
                f"| {sum(f.throughput_met is True for f in felt)} of {len(mine)} "
                f"| {migration.fmt2(migration.median(worst))} "
                f"| {cpu_change(mine)} | {migration.fmt2(migration.median(present(mine, 'stealAfter')))} |"
            )
    return lines


def present(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def cpu_change(runs: list[dict[str, Any]]) -> str:
    before, after = migration.median(present(runs, "cpuBefore")), migration.median(present(runs, "cpuAfter"))
    return f"{migration.fmt2(before)} → {migration.fmt2(after)}"


def totals(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for protocol in LABELS:
        felt = [r["latency"] for r in runs if r["protocol"] == protocol]
        if felt:
            what = "nothing requested" if protocol == migration.NO_RESCALE else "a keyGroups rescale"
            lines.append(
                f"- {what}: p99 ≤ {P99_TARGET:g}× in {sum(f.p99_met is True for f in felt)} of {len(felt)} runs, "
                f"worst 100 ms ≥ {THROUGHPUT_TARGET:g} in {sum(f.throughput_met is True for f in felt)} of "
                f"{len(felt)}."
            )
    return lines


def report(out: str, runs: list[dict[str, Any]], args: argparse.Namespace, took_s: float) -> str:
    lost = sum(r["lost"] for r in runs)
    duplicated = sum(r["duplicated"] for r in runs)
    lines = [
        "# The migration benchmark's noise floor",
        "",
        f"`python bench/migration_noise.py --runs {args.runs} --dags {args.dags}`: {len(runs)} runs in "
        f"{took_s:.0f} s. Each DAG and direction ran {args.runs} times with nothing requested at the request's "
        "time and as often with a `keyGroups` rescale, alternated, read over the same windows as "
        f"[migration.md](migration.md): the worst of the {AFTER_S / migration.BUCKET_S:.0f} buckets of 100 ms "
        f"in the {AFTER_S:g} s after the request against the {STEADY_S:g} s before.",
        "",
        *totals(runs),
        "",
        *cell_rows(runs),
        "",
        f"Lost {lost} and duplicated {duplicated} events over every run (the runs with nothing requested included).",
        "",
    ]
    path = os.path.join(out, "migration-noise.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each label per DAG and direction (5)")
    parser.add_argument("--dags", default="ccr-star,ccr-diamond", help="comma-separated DAGs (ccr-star,ccr-diamond)")
    parser.add_argument("--out", default=os.path.join(migration.REPO, "docs", "benchmarks"))
    args = parser.parse_args(argv)
    before_s, after_s = migration.WARMUP_S + STEADY_S, AFTER_S + migration.TAIL_S
    started = time.monotonic()
    directory = tempfile.mkdtemp(prefix="elastream-noise-")
    redis = migration.EmbeddedRedis(directory)
    runs: list[dict[str, Any]] = []
    try:
        for round_number in range(args.runs):
            migration.log(f"round {round_number + 1} of {args.runs}")
            for dag in args.dags.split(","):
                for direction in ("out", "in"):
                    for protocol in LABELS:
                        runs.append(
                            migration.one_run(
                                directory, redis.url, dag, direction, protocol, before_s, after_s, 500 + round_number
                            )
                        )
    finally:
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    path = report(args.out, runs, args, time.monotonic() - started)
    migration.log(f"wrote {path} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
