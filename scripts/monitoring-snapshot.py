"""The picture in docs/monitoring.md: the chart's Grafana dashboard (charts/elastream/files/dashboard.json) on a
real run, its panels' own queries asked of a real Prometheus and plotted where the dashboard puts them.

It runs a topology locally (`elastream run MANIFEST --metrics-port P`: the controller's metrics, the operator's
set, at 127.0.0.1:P and each worker's at its node's loopback address and P), starts Prometheus (Debian's
`prometheus`) scraping those addresses every 2 s, lets the topology run, scales it out and back in with
`elastream scale`, then asks Prometheus for every panel query of the dashboard over the run (`query_range`, with
$namespace and $topology the manifest's and $__rate_interval 1m) and draws them in the dashboard's grid
(gridPos), titles the panels', the rescales as vertical lines where the dashboard's annotation query finds them.
It prints what it saw: per panel and series, the last, lowest and highest value.

    .venv/bin/python scripts/monitoring-snapshot.py                      # examples/demo.yaml, 4 -> 5 -> 3 nodes
    .venv/bin/python scripts/monitoring-snapshot.py --manifest M --phase 60 --out 3 --in 2 --png /tmp/d.png
    .venv/bin/python scripts/monitoring-snapshot.py --redraw /tmp/elastream-monitoring-N/snapshot.json

It takes about 5 minutes with the defaults (the start, a minute of scraping, three phases of --phase seconds,
the rescales). Every process it starts (redis-server, elastream run and its workers, prometheus) is stopped on
the way out. The queries' answers are kept in the work directory (snapshot.json): --redraw draws them again,
running nothing (the panels' layout and titles from the dashboard as it is then).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))  # support/
sys.path.insert(0, os.path.join(HERE, os.pardir, "operator", "src"))
from elastream.control.backends.local import node_host  # noqa: E402
from support.harness import log_tail  # noqa: E402
from support.paths import REPO  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.prometheus import (  # noqa: E402
    Prometheus,
    dashboard_annotations,
    dashboard_panels,
    substitute,
)
from support.redis_servers import RedisServer  # noqa: E402

DASHBOARD = os.path.join(REPO, "charts", "elastream", "files", "dashboard.json")
PNG = os.path.join(REPO, "docs", "monitoring", "dashboard.png")
#: worker addresses Prometheus is given: node-0 .. node-15. A local run names new nodes with the next free
#: index, so a scale-out and back stays well within; an address without a worker is a target that is down
#: (`up` 0), which no panel reads
NODE_TARGETS = 16
STEP_S = 5.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", default=os.path.join(REPO, "examples", "demo.yaml"), help="StreamTopology file")
    parser.add_argument("--warm", type=float, default=60.0, help="seconds scraped before the picture starts (60)")
    parser.add_argument("--phase", type=float, default=50.0, help="seconds before, between and after the rescales")
    parser.add_argument("--out", type=int, default=None, help="nodes after the scale-out (default: spec.nodes + 1)")
    parser.add_argument("--in", dest="in_nodes", type=int, default=None, help="nodes after the scale-in (spec - 1)")
    parser.add_argument("--engine", choices=("spark", "python"), default="python", help="metric analysis engine")
    parser.add_argument("--dashboard", default=DASHBOARD, help="the Grafana dashboard (default: the chart's)")
    parser.add_argument("--png", default=PNG, help=f"where the picture goes (default {os.path.relpath(PNG, REPO)})")
    parser.add_argument("--redraw", metavar="JSON", default=None, help="draw a run's saved answers again, run nothing")
    parser.add_argument("--workdir", default=None, help="keep the run's and Prometheus' files here (default: temp)")
    return parser.parse_args(argv)


def get(url: str, timeout_s: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def wait_serving(url: str, pattern: str, run: subprocess.Popen[bytes], log: str, timeout_s: float) -> None:
    """Until `url` answers with a line matching `pattern`; SystemExit with the run's log if the run exits or time
    runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise SystemExit(f"elastream run exited ({run.returncode}):\n{log_tail(log, 30)}")
        try:
            if re.search(pattern, get(url)):
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} did not serve {pattern!r} within {timeout_s:g} s:\n{log_tail(log, 30)}")


def scale(manifest: str, redis_url: str, nodes: int) -> float:
    """`elastream scale --nodes` (it waits for the outcome); the time it was asked."""
    asked = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "elastream", "scale", manifest, "--redis", redis_url, "--nodes", str(nodes)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    print(done.stdout.strip(), flush=True)
    if done.returncode != 0:
        raise SystemExit(f"elastream scale --nodes {nodes} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return asked


# ---- the picture ------------------------------------------------------------------------------------------------
def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label (nothing when the series has none)."""
    out = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()
    return out or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"


def scaled_unit(unit: str) -> tuple[float, str]:
    """A divisor and a suffix for the y axis: bytes in MiB, seconds as they are, counts as they are."""
    if unit in ("bytes", "decbytes"):
        return 1024.0 * 1024.0, "MiB"
    if unit in ("s", "dtdurations"):
        return 1.0, "s"
    if unit in ("ms",):
        return 1.0, "ms"
    if unit.startswith("ops") or unit == "reqps":
        return 1.0, "/s"
    return 1.0, ""


def draw(
    panels: list[dict[str, Any]],
    results: dict[tuple[int, int], list[dict[str, Any]]],
    rescales: list[float],
    start: float,
    end: float,
    title: str,
    png: str,
    layout: dict[int, dict[str, int]],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(p["y"] + p["h"] for p in layout.values())
    width_in, height_in = 16.0, max(6.0, rows * 0.45 + 0.6)
    fig = plt.figure(figsize=(width_in, height_in))
    fig.suptitle(title, fontsize=12, x=0.01, y=1 - 0.15 / height_in, ha="left", va="top")
    # the grid in figure fractions; each panel's margins in inches (its title above, tick labels left and below)
    top, bottom, left, right = 1 - 0.6 / height_in, 0.1 / height_in, 0.01, 0.995
    cell_w, cell_h = (right - left) / 24.0, (top - bottom) / rows
    pad_left, pad_right = 0.55 / width_in, 0.15 / width_in
    pad_top, pad_bottom = 0.35 / height_in, 0.45 / height_in
    for index, panel in enumerate(panels):
        pos = layout[index]
        ax = fig.add_axes(
            (
                left + pos["x"] * cell_w + pad_left,
                top - (pos["y"] + pos["h"]) * cell_h + pad_bottom,
                pos["w"] * cell_w - pad_left - pad_right,
                pos["h"] * cell_h - pad_top - pad_bottom,
            )
        )
        ax.set_title(panel["title"], fontsize=10, loc="left")
        divisor, suffix = scaled_unit(panel["unit"])
        for t, target in enumerate(panel["targets"]):
            for series in results[(index, t)]:
                xs = [(float(ts) - start) / 60.0 for ts, _ in series["values"]]
                ys = [float(v) / divisor for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1.4, label=legend(target["legend"], series["metric"]))
        for at in rescales:
            ax.axvline((at - start) / 60.0, color="#d62728", linestyle="--", linewidth=1.0, alpha=0.8)
        ax.set_xlim(0.0, (end - start) / 60.0)
        ax.set_xlabel("minutes", fontsize=8)
        if suffix:
            ax.set_ylabel(suffix, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


def grid_layout(dashboard: dict[str, Any], panels: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Each panel's gridPos (24 columns wide, rows of Grafana's 30 px), by title; rows of 8 when it has none."""
    positions: dict[str, dict[str, int]] = {}

    def walk(items: list[dict[str, Any]]) -> None:
        for item in items:
            if item.get("type") == "row":
                walk(item.get("panels") or [])
            elif item.get("gridPos"):
                positions.setdefault(str(item.get("title", "")), dict(item["gridPos"]))

    walk(dashboard.get("panels") or [])
    layout: dict[int, dict[str, int]] = {}
    for index, panel in enumerate(panels):
        fallback = {"x": 12 * (index % 2), "y": 8 * (index // 2), "w": 12, "h": 8}
        layout[index] = positions.get(panel["title"], fallback)
    # rows without panels (the row headers) leave gaps: close them up so the picture has no empty bands
    used = sorted({y for p in layout.values() for y in range(p["y"], p["y"] + p["h"])})
    shift = {y: i for i, y in enumerate(used)}
    return {i: {**p, "y": shift[p["y"]]} for i, p in layout.items()}


def runs(points: list[float], step: float) -> list[tuple[float, float]]:
    """Contiguous runs of timestamps `step` apart, as (first, last): one annotation each (the query holds for a
    while after each rescale; Grafana draws one region a run, the picture a line where it starts)."""
    found: list[tuple[float, float]] = []
    for t in sorted(points):
        if found and t - found[-1][1] <= step * 1.5:
            found[-1] = (found[-1][0], t)
        else:
            found.append((t, t))
    return found


def summarize(values: list[tuple[float, str]]) -> str:
    finite = [float(v) for _, v in values if math.isfinite(float(v))]
    if not finite:
        return "no finite value"
    return f"last {finite[-1]:.4g}, min {min(finite):.4g}, max {max(finite):.4g}"


# ---- the run ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with open(args.manifest, encoding="utf-8") as handle:
        manifest = yaml.safe_load(handle)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace") or "default"
    nodes = int(manifest["spec"].get("nodes") or 1)
    out_nodes = args.out or nodes + 1
    in_nodes = args.in_nodes or max(1, nodes - 1)
    with open(args.dashboard, encoding="utf-8") as handle:
        dashboard = json.load(handle)
    panels = dashboard_panels(dashboard)
    variables = {"namespace": namespace, "topology": name, "datasource": "prometheus"}
    if args.redraw:
        with open(args.redraw, encoding="utf-8") as handle:
            saved = json.load(handle)
        answers = {(i, t): rows for i, t, rows in saved["results"]}
        draw(panels, answers, saved["rescales"], saved["start"], saved["end"], saved["title"], args.png,
             grid_layout(dashboard, panels))  # fmt: skip
        print(f"wrote {args.png}")
        return 0

    workdir = args.workdir or os.path.join("/tmp", f"elastream-monitoring-{os.getpid()}")
    os.makedirs(workdir, exist_ok=True)
    hosts = [node_host(f"node-{i}") for i in range(NODE_TARGETS)]
    port = free_port("127.0.0.1", *hosts)
    # a small maxmemory, so that the Redis panel shows the used memory against a limit
    redis_server = RedisServer("--maxmemory", "64mb", "--maxmemory-policy", "noeviction").start()
    run_log = os.path.join(workdir, "elastream-run.log")
    run: subprocess.Popen[bytes] | None = None
    prom: Prometheus | None = None
    try:
        with open(run_log, "ab") as log_handle:
            run = subprocess.Popen(
                [sys.executable, "-m", "elastream", "run", args.manifest, "--redis", redis_server.url,
                 "--metrics-port", str(port), "--engine", args.engine],
                stdout=log_handle, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
            )  # fmt: skip
        print(f"elastream run {name} ({nodes} nodes), metrics at 127.0.0.1:{port}; log {run_log}", flush=True)
        jobs = [
            # honor_labels: the series carry the topology's namespace themselves (what the chart's monitors say)
            {"job_name": "elastream-operator", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            {"job_name": "elastream-workers", "honor_labels": True,
             "static_configs": [{"targets": [f"{host}:{port}" for host in hosts]}]},
        ]  # fmt: skip
        prom = Prometheus(jobs, workdir=os.path.join(workdir, "prometheus")).start()
        print(f"prometheus at {prom.url}", flush=True)
        running = r'elastream_topology_phase\{[^}]*phase="Running"[^}]*\} 1\.0'
        wait_serving(f"http://127.0.0.1:{port}/metrics", running, run, run_log, 300)
        # the picture starts once Prometheus has scraped for a minute: before, a rate over [1m] (the dashboard's
        # $__rate_interval here) still fills up and draws a ramp that is not the topology's
        time.sleep(args.warm)
        start = time.time()
        print(f"running; {args.phase:g} s before the scale-out", flush=True)
        time.sleep(args.phase)
        asked_out = scale(args.manifest, redis_server.url, out_nodes)
        time.sleep(args.phase)
        asked_in = scale(args.manifest, redis_server.url, in_nodes)
        time.sleep(args.phase)
        end = time.time()

        results: dict[tuple[int, int], list[dict[str, Any]]] = {}
        print(f"\nwhat the dashboard's panels showed ({namespace}/{name}, {(end - start) / 60:.1f} min):")
        for index, panel in enumerate(panels):
            for t, target in enumerate(panel["targets"]):
                expr = substitute(target["expr"], variables)
                results[(index, t)] = prom.query_range(expr, start, end, STEP_S)
                for series in results[(index, t)]:
                    label = legend(target["legend"], series["metric"])
                    print(f"  {panel['title']} | {label}: {summarize(series['values'])}")
                if not results[(index, t)]:
                    print(f"  {panel['title']} | {expr}: NO SERIES")
        rescales: list[float] = []
        for annotation in dashboard_annotations(dashboard):
            expr = substitute(annotation["expr"], variables)
            points = [float(ts) for s in prom.query_range(expr, start, end, STEP_S) for ts, _ in s["values"]]
            rescales += [first for first, _ in runs(points, STEP_S)]
            print(f"  annotation {annotation['name']}: {len(runs(points, STEP_S))} region(s) {expr}")
        print(f"  rescales asked at +{asked_out - start:.0f} s (out to {out_nodes}) and +{asked_in - start:.0f} s "
              f"(in to {in_nodes})")  # fmt: skip
        title = (
            f"elastream dashboard, {namespace}/{name}: `elastream run` {nodes} nodes, scaled out to {out_nodes} "
            f"and in to {in_nodes} (red: the rescale annotations)"
        )
        raw = os.path.join(workdir, "snapshot.json")
        with open(raw, "w", encoding="utf-8") as handle:
            json.dump({"title": title, "start": start, "end": end, "rescales": rescales,
                       "results": [[i, t, rows] for (i, t), rows in results.items()]}, handle)  # fmt: skip
        draw(panels, results, rescales, start, end, title, args.png, grid_layout(dashboard, panels))
        print(f"wrote {args.png} (the queries' answers: {raw}; --redraw {raw} draws them again)")
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the run stops its workers and reaps them
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=10)
        if prom is not None:
            prom.stop()
        redis_server.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
