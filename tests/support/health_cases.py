"""StreamTopology documents in each state the operator reports, with what GitOps tools should make of them.

Each case is a whole resource (metadata.generation, status with phase, observedGeneration and the conditions
`core.status` computes), and the health kstatus (sigs.k8s.io/cli-utils) and the Argo CD health check
(deploy/argocd/streamtopology-health.lua) are expected to give it. The unit tests check both against these;
`python tests/support/health_cases.py DIR` writes each document as DIR/<case>.json and DIR/expected.tsv, for the kstatus
checker of the e2e tier (tests/e2e/kstatus, scripts/kstatus-tool.sh) to confirm with the real kstatus.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from elastream.core.status import STALL_AFTER_FAILURES, StatusFacts, desired_conditions, merge_conditions, phase

NOW = "2026-01-01T00:00:00Z"
REDIS_DOWN = "ConnectionError: Error 111 connecting to redis:6379. Connection refused."


@dataclass(frozen=True)
class Case:
    facts: StatusFacts
    kstatus: str  # Current, InProgress or Failed
    argocd: str  # Healthy, Progressing or Degraded
    generation: int = 1
    observed: int = 1


CASES: dict[str, Case] = {
    "running": Case(StatusFacts(3, 3, started=True), "Current", "Healthy"),
    "starting": Case(StatusFacts(3, 0), "InProgress", "Progressing"),
    "pods-pending": Case(
        StatusFacts(3, 2, pending="pod t-node-2 cannot be scheduled: 0/3 nodes are available"),
        "InProgress",
        "Progressing",
    ),
    "scaling": Case(StatusFacts(3, 3, started=True, scaling=True), "InProgress", "Progressing"),
    "redis-briefly-away": Case(
        StatusFacts(3, 3, started=True, redis_unavailable=REDIS_DOWN, redis_down_s=5.0), "InProgress", "Progressing"
    ),
    "redis-away-long": Case(
        StatusFacts(3, 3, started=True, redis_unavailable=REDIS_DOWN, redis_down_s=90.0), "InProgress", "Degraded"
    ),
    "worker-lost": Case(
        StatusFacts(3, 2, started=True, worker_lost="pod t-node-1 is gone", recovering=True), "InProgress", "Degraded"
    ),
    "scaling-failed-once": Case(
        StatusFacts(3, 3, started=True, scaling_failed="pods not ready after 60 s", scaling_failures=1),
        "InProgress",
        "Degraded",
    ),
    "scaling-failed-repeatedly": Case(
        StatusFacts(
            3, 3, started=True, scaling_failed="pods not ready after 60 s", scaling_failures=STALL_AFTER_FAILURES
        ),
        "Failed",
        "Degraded",
    ),
    "start-failed-once": Case(
        StatusFacts(3, 0, backend_error="pods is forbidden: exceeded quota", start_failures=1), "InProgress", "Degraded"
    ),
    "start-failed-repeatedly": Case(
        StatusFacts(3, 0, backend_error="pods is forbidden: exceeded quota", start_failures=STALL_AFTER_FAILURES),
        "Failed",
        "Degraded",
    ),
    "invalid-spec": Case(
        StatusFacts(3, 0, invalid_spec="spec.slotsPerNode: 3 nodes x 1 slots cannot hold 5 executors"),
        "Failed",
        "Degraded",
    ),
    "state-lost": Case(
        StatusFacts(3, 3, started=True, state_lost="the topology's state in Redis is gone (epoch e-1 missing)"),
        "Failed",
        "Degraded",
    ),
    "object-not-owned": Case(
        StatusFacts(3, 0, not_owned="ConfigMap t-topology exists and is not this topology's: delete or rename it"),
        "Failed",
        "Degraded",
    ),
    "redis-user-refused": Case(
        StatusFacts(3, 3, started=True, redis_user_refused="NOPERM: ACL SETUSER refused: grant +acl"),
        "Failed",
        "Degraded",
    ),
    # spec.suspend: true reached: nothing runs and nothing is wrong (as a Deployment scaled to zero)
    "suspended": Case(StatusFacts(0, 0, started=True, suspended=True, suspended_at="ckpt-12"), "Current", "Suspended"),
    "suspended-before-any-checkpoint": Case(StatusFacts(0, 0, started=True, suspended=True), "Current", "Suspended"),
    "suspending": Case(
        StatusFacts(3, 3, started=True, suspending="taking the last checkpoint before stopping the workers"),
        "InProgress",
        "Progressing",
    ),
    "suspend-failed-repeatedly": Case(
        StatusFacts(
            3,
            3,
            started=True,
            suspending="the last checkpoint was not taken: node-2 not answering",
            suspend_failures=STALL_AFTER_FAILURES,
        ),
        "Failed",
        "Degraded",
    ),
    "resuming": Case(StatusFacts(3, 0, started=True, resuming=True), "InProgress", "Progressing"),
    # suspended, and then Redis lost its data: what only the user can fix wins over Suspended
    "suspended-state-lost": Case(
        StatusFacts(0, 0, started=True, suspended=True, state_lost="epoch e-1 missing"), "Failed", "Degraded"
    ),
    # a stateful upgrade in flight: generation 2 is not applied yet (observedGeneration lags)
    "upgrading": Case(
        StatusFacts(3, 0, started=True, upgrading="generation 2: starting the new pods from checkpoint ckpt-3"),
        "InProgress",
        "Progressing",
        2,
        1,
    ),
    # its new pods did not start: rolled back, generation 2 judged (observed) and Stalled
    "upgrade-rolled-back": Case(
        StatusFacts(3, 3, started=True, upgrade_failed="the upgrade to generation 2 was rolled back"),
        "Failed",
        "Degraded",
        2,
        2,
    ),
    "upgrade-refused": Case(
        StatusFacts(3, 3, started=True, upgrade_refused="spec.vertices[1].maxParallelism: 128 → 64"),
        "Failed",
        "Degraded",
        2,
        2,
    ),
    # the spec changed (generation 2) and the operator has not reported on it yet: whatever the conditions say
    "generation-not-observed": Case(StatusFacts(3, 3, started=True), "InProgress", "Progressing", 2, 1),
    "stalled-generation-not-observed": Case(
        StatusFacts(3, 0, invalid_spec="spec.nodes: must be at least 1"), "InProgress", "Progressing", 2, 1
    ),
}


def document(name: str, case: Case) -> dict[str, Any]:
    """The StreamTopology resource of `case`, as `kubectl get -o json` shows it."""
    facts = case.facts
    return {
        "apiVersion": "elastream.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": "default", "generation": case.generation},
        "spec": {"nodes": facts.desired_nodes},
        "status": {
            "phase": phase(facts),
            "nodes": facts.desired_nodes if facts.started and not facts.suspended else 0,
            "readyNodes": facts.ready_nodes,
            "observedGeneration": case.observed,
            "conditions": merge_conditions(None, desired_conditions(facts), NOW, case.observed),
        },
    }


def write(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "expected.tsv"), "w", encoding="utf-8") as expected:
        for name, case in CASES.items():
            with open(os.path.join(directory, f"{name}.json"), "w", encoding="utf-8") as handle:
                json.dump(document(name, case), handle, indent=2)
            expected.write(f"{name}\t{case.kstatus}\t{case.argocd}\n")


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else "health-cases")
