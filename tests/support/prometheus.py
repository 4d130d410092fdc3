"""A real Prometheus server for tests and scripts: Debian's `prometheus` (2.x) started on a free loopback port
with a generated configuration and a temporary storage directory, read through its HTTP API.

    with Prometheus(scrape_configs=[{"job_name": "x", "static_configs": [{"targets": ["127.0.0.1:9100"]}]}],
                    rule_files=["rules.yaml"]) as prom:
        prom.wait_for(lambda: prom.query("up == 1"), 30, "a target up")
        prom.query('elastream_topology_phase{phase="Running"}')

Every wait is bounded and says what it waited for; the server's log is kept (`log_tail()`) for failure messages,
and `stop()` removes the storage directory (the log stays beside it only when `keep_log` names a file).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from support.harness import log_tail
from support.ports import free_port


class PrometheusError(RuntimeError):
    """Prometheus did not start, refused a query, or a wait on it ran out; the message says which and why."""


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError(
            "prometheus is not installed: run `bash scripts/system-deps.sh` (Debian's `prometheus` package)"
        )
    return binary


class Prometheus:
    """One Prometheus process. `scrape_configs` and `rule_files` go into its configuration as given;
    `scrape_interval` and `evaluation_interval` are the global ones (short: tests wait on them)."""

    def __init__(
        self,
        scrape_configs: Sequence[Mapping[str, Any]],
        rule_files: Sequence[str] = (),
        *,
        scrape_interval: str = "2s",
        evaluation_interval: str = "2s",
        workdir: str | None = None,
    ) -> None:
        self.binary = prometheus_binary()
        self.workdir = workdir or tempfile.mkdtemp(prefix="elastream-prometheus-")
        self._own_workdir = workdir is None
        os.makedirs(self.workdir, exist_ok=True)
        self.config_file = os.path.join(self.workdir, "prometheus.yml")
        self.storage = os.path.join(self.workdir, "data")
        self.log = os.path.join(self.workdir, "prometheus.log")
        self.config: dict[str, Any] = {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [os.path.abspath(path) for path in rule_files],
            "scrape_configs": [dict(c) for c in scrape_configs],
        }
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> Prometheus:
        with open(self.config_file, "w", encoding="utf-8") as handle:
            # through JSON first: a dict shared by two jobs would be written as a YAML anchor and alias
            yaml.safe_dump(json.loads(json.dumps(self.config)), handle, sort_keys=False)
        for _attempt in range(3):  # a free port can be taken between the probe and Prometheus' bind
            self.port = free_port()
            self._spawn()
            try:
                self._await_ready(timeout_s)
                return self
            except PrometheusError:
                exited = self.proc is not None and self.proc.poll() is not None
                if not (exited and "address already in use" in self.log_tail(20)):
                    self.stop(remove=False)
                    raise
                self.stop(remove=False)
        raise PrometheusError(f"no free port for Prometheus after 3 attempts:\n{self.log_tail()}")

    def _spawn(self) -> None:
        self._log_handle = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        argv = [
            self.binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=info",
        ]
        self._log_handle.write(f"$ {' '.join(argv)}\n".encode())
        self._log_handle.flush()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,  # a Ctrl-C of pytest does not hit it before stop() runs
        )

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc.poll() if self.proc is not None else None
                raise PrometheusError(f"prometheus exited ({code}) before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready within {timeout_s:g} s (last: {last}):\n{self.log_tail()}")

    def stop(self, remove: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if remove:
            shutil.rmtree(self.storage, ignore_errors=True)
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)

    # ---- the HTTP API ----------------------------------------------------------------------------------------
    def api(self, path: str, params: Mapping[str, Any] | None = None, timeout_s: float = 15.0) -> Any:
        """GET /api/v1/`path` with `params`: its `data`, or PrometheusError with Prometheus' own error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"{self.url}/api/v1/{path}{query}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {exc.code}") from exc
        except OSError as exc:
            raise PrometheusError(f"GET {url}: {exc}\n{self.log_tail(20)}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {labels}, "value": [t, "v"]}, ...] (a scalar result as one such row)."""
        data = self.api("query", {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query: [{"metric": {labels}, "values": [[t, "v"], ...]}, ...]."""
        data = self.api(
            "query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        )
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts (pending and firing): [{"labels", "annotations", "state", "activeAt", "value"}]."""
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups, with each rule's health and last error."""
        return list(self.api("rules")["groups"])

    def targets(self) -> list[dict[str, Any]]:
        """The active targets, with their labels, health and last scrape error."""
        return list(self.api("targets", {"state": "active"})["activeTargets"])

    def describe_targets(self) -> str:
        """One line per active target, for failure messages."""
        try:
            rows = self.targets()
        except PrometheusError as exc:
            return str(exc)
        return (
            "\n".join(
                f"  {t['labels'].get('job')} {t['scrapeUrl']} {t['health']} {t.get('lastError') or ''}".rstrip()
                for t in rows
            )
            or "  (no active targets)"
        )

    def wait_for(self, probe: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
        """`probe()` until it returns something true (returned); PrometheusError naming `what` after `timeout_s`,
        with the targets and the log's tail. A PrometheusError of the probe is retried until then."""
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while True:
            try:
                found = probe()
                if found:
                    return found
            except PrometheusError as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"waited {timeout_s:g} s for {what}"
                    + (f" (last error: {last_error})" if last_error else "")
                    + f"\ntargets:\n{self.describe_targets()}\nprometheus log:\n{self.log_tail(15)}"
                )
            time.sleep(poll_s)


# ---- what a dashboard and a rule file ask of Prometheus -----------------------------------------------------------
#: Grafana's own interval variables, as a test or a script substitutes them (Grafana computes them from the
#: scrape interval and the zoom; one minute covers several 2 s scrapes)
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m"}

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """`expr` with Grafana's variables ($name, ${name}, ${name:format}, [[name]]) replaced from `variables` and
    `GRAFANA_INTERVALS`; ValueError naming any variable left unknown."""
    values = {**GRAFANA_INTERVALS, **variables}
    unknown: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in values:
            unknown.append(name)
            return match.group(0)
        return values[name]

    result = _VARIABLE.sub(replace, expr)
    if unknown:
        raise ValueError(f"unknown dashboard variable(s) {', '.join(sorted(set(unknown)))} in {expr!r}")
    return result


def _panels(panels: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every panel, those inside rows (a collapsed row holds its panels) included, rows themselves left out."""
    found: list[Mapping[str, Any]] = []
    for panel in panels:
        if panel.get("type") == "row":
            found += _panels(panel.get("panels") or [])
        else:
            found.append(panel)
    return found


def dashboard_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{"title", "type", "unit", "targets": [{"expr", "legend"}]}] of every panel with a Prometheus query, in
    the dashboard's order (top to bottom, left to right by gridPos)."""
    panels = sorted(
        _panels(dashboard.get("panels") or []),
        key=lambda p: ((p.get("gridPos") or {}).get("y", 0), (p.get("gridPos") or {}).get("x", 0)),
    )
    out: list[dict[str, Any]] = []
    for panel in panels:
        targets = [
            {"expr": str(t["expr"]), "legend": str(t.get("legendFormat") or "")}
            for t in panel.get("targets") or []
            if str(t.get("expr") or "").strip() and not t.get("hide")
        ]
        if targets:
            unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "")
            out.append({"title": str(panel.get("title", "")), "type": panel.get("type"), "unit": unit,
                        "targets": targets})  # fmt: skip
    return out


def dashboard_annotations(dashboard: Mapping[str, Any]) -> list[dict[str, str]]:
    """[{"name", "expr", "text"}] of the dashboard's Prometheus annotation queries (Grafana's built-in
    "Annotations & Alerts" has no expr and is left out)."""
    return [
        {
            "name": str(a.get("name", "")),
            "expr": str(a["expr"]),
            "text": str(a.get("textFormat") or a.get("titleFormat") or ""),
        }
        for a in (dashboard.get("annotations") or {}).get("list") or []
        if str(a.get("expr") or "").strip()
    ]


#: every series elastream serves is named elastream_*: in a query, a vector selector is such a name with its
#: optional {matchers} (a range [1m] after it, functions, aggregations, comparisons and label names around it
#: are not part of it). Reading them out this way needs no PromQL parser: elastream's queries name no other
#: metric, and no label value of theirs starts with elastream_
_SELECTOR = re.compile(r"(?<![\w:\"])(elastream_[A-Za-z0-9_:]*)\s*(\{[^{}]*\})?")
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def vector_selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The elastream vector selectors in `expr`: [(metric name, [(label, op, value), ...])], each once, in order."""
    found: list[tuple[str, list[tuple[str, str, str]]]] = []
    for match in _SELECTOR.finditer(expr):
        selector = (match.group(1), _MATCHER.findall(match.group(2) or ""))
        if selector not in found:
            found.append(selector)
    return found


def selector_text(name: str, matchers: Sequence[tuple[str, str, str]]) -> str:
    inner = ",".join(f'{label}{op}"{value}"' for label, op, value in matchers)
    return f"{name}{{{inner}}}" if inner else name


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text: str) -> float:
    """A Prometheus duration ("1m", "1h30m", "10s") in seconds; ValueError for anything else."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _DURATION_S[u] for n, u in parts)


def alerting_rules(groups: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The alerting rules (those with `alert:`) of every group, recording rules left out."""
    return [rule for group in groups for rule in group.get("rules") or [] if "alert" in rule]


def with_for_at_most(groups: Sequence[Mapping[str, Any]], at_most: str) -> list[dict[str, Any]]:
    """A copy of the rule `groups` in which no alert waits longer than `at_most` (`for:`) before it fires: for a
    test that makes a condition true and waits for the alert (the real durations are the rule file's own)."""
    limit = duration_seconds(at_most)
    copy: list[dict[str, Any]] = json.loads(json.dumps(list(groups)))
    for rule in alerting_rules(copy):
        if "for" in rule and duration_seconds(str(rule["for"])) > limit:
            rule["for"] = at_most
    return copy


# ---- Kubernetes pod discovery for a Prometheus built without it ---------------------------------------------------
def _meta_name(name: str) -> str:
    """A Kubernetes label's or annotation's name as Prometheus' service discovery spells it in __meta_* labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The target groups Prometheus' `kubernetes_sd_configs` role `pod` makes of `pods` (items of a PodList): one
    group per pod, one target per container port (a container without ports: one target at the pod IP), with the
    same `__meta_kubernetes_*` labels (namespace, pod name, IP, phase, ready, node, labels and labelpresent,
    annotations, container name, image, port name, number and protocol, controller kind and name)."""
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue  # not placed or not started yet: Prometheus lists no target for it either
        ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "unknown")
        common = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": str(ready).lower(),
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        }
        for kind, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
            for key, value in values.items():
                common[f"__meta_kubernetes_pod_{kind}_{_meta_name(key)}"] = str(value)
                common[f"__meta_kubernetes_pod_{kind}present_{_meta_name(key)}"] = "true"
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if owner is not None:
            common["__meta_kubernetes_pod_controller_kind"] = owner.get("kind", "")
            common["__meta_kubernetes_pod_controller_name"] = owner.get("name", "")
        targets: list[tuple[str, dict[str, str]]] = []
        for container in spec.get("containers") or []:
            labels = {
                "__meta_kubernetes_pod_container_name": container.get("name", ""),
                "__meta_kubernetes_pod_container_image": container.get("image", ""),
                "__meta_kubernetes_pod_container_init": "false",
            }
            ports = container.get("ports") or []
            if not ports:
                targets.append((ip, labels))
            for port in ports:
                targets.append((f"{ip}:{port['containerPort']}", {
                    **labels,
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }))  # fmt: skip
        # http_sd: one group per distinct label set (a group's labels apply to all its targets)
        for address, labels in targets:
            groups.append({"targets": [address], "labels": {**common, **labels}})
    return groups


class KubernetesPodDiscovery:
    """Prometheus' Kubernetes service discovery, role `pod`, served over HTTP service discovery.

    Debian's `prometheus` package is built without the Kubernetes discoverer (`kubernetes_sd_configs` is an
    unknown field there). This lists the pods from the API server at `api_server` as Prometheus would, with a
    bearer token (`token_file`: an identity allowed to list pods) and the server's CA, each time Prometheus asks,
    and answers with the targets and `__meta_kubernetes_pod_*` labels of `pod_targets`: the relabelings written
    for `role: pod` (the Prometheus Operator's, from a PodMonitor) apply to them unchanged. `sd_config(namespaces)`
    is the `http_sd_configs` entry that stands for `kubernetes_sd_configs: [{role: pod, namespaces: ...}]`."""

    def __init__(self, api_server: str, token_file: str, ca_file: str, refresh_interval: str = "2s") -> None:
        self.api_server = api_server.rstrip("/")
        self.token_file = token_file
        self.context = ssl.create_default_context(cafile=ca_file)
        self.refresh_interval = refresh_interval
        self.errors: list[str] = []  # what listing the pods answered when it failed (for failure messages)
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> KubernetesPodDiscovery:
        discovery = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                namespaces = [n for n in ",".join(query.get("namespaces", [])).split(",") if n]
                try:
                    body = json.dumps(pod_targets(discovery.pods(namespaces))).encode()
                    self.send_response(200)
                except (OSError, ValueError) as exc:  # Prometheus keeps the last targets and asks again
                    discovery.errors.append(str(exc))
                    body = str(exc).encode()
                    self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="pod-discovery").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/pods"

    def pods(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        """The pods of `namespaces` (none: every namespace), as the API server lists them to the token's identity."""
        with open(self.token_file, encoding="utf-8") as handle:
            token = handle.read().strip()
        paths = [f"/api/v1/namespaces/{ns}/pods" for ns in namespaces] or ["/api/v1/pods"]
        items: list[dict[str, Any]] = []
        for path in paths:
            request = urllib.request.Request(self.api_server + path, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, context=self.context, timeout=10) as resp:
                items += json.loads(resp.read())["items"]
        return items

    def sd_config(self, namespaces: Sequence[str] | None = None) -> dict[str, Any]:
        query = f"?namespaces={','.join(namespaces)}" if namespaces else ""
        return {"url": self.url + query, "refresh_interval": self.refresh_interval}
