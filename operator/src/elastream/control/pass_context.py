"""What one reconcile pass observes, gathered once and handed to its parts (`PassContext`): the resource as the
pass read it (`Observation`: its metadata, generation, spec, annotations and the topology it asks for, or why it
cannot run here), the pass's `now`, and, once the topology's controller ran its tick, the schedule its workers run
and what the controller knows of Redis (away, the state lost). The parts read these instead of asking the
backend or the controller again; none of them builds or changes a context: the pass does, after a step that
changes what runs. Reading it adds no Redis round trip: the schedule and Redis facts are the controller's
memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastream.control.backends.worker_objects import WorkerPodSettings, placement_problems, pod_template_problems
from elastream.control.controller import TopologyController
from elastream.control.resource_api import topology_from_resource
from elastream.core.images import image_allowed, image_refusal
from elastream.core.ports import BackendError
from elastream.core.schedule import Schedule
from elastream.core.topology import Topology, TopologyError


@dataclass(frozen=True)
class Observation:
    """What a pass reads of the resource, once: its metadata, generation, spec and annotations, and the
    topology it asks for (None when it cannot run here: `invalid` says why)."""

    metadata: Mapping[str, Any]
    generation: int
    spec: dict[str, Any]
    annotations: Mapping[str, Any]
    wanted: Topology | None
    invalid: str = ""


def observe(body: Mapping[str, Any], allowed_images: tuple[str, ...], settings: WorkerPodSettings) -> Observation:
    """The resource as a pass sees it (`observe_resource` parses and checks what it asks for)."""
    metadata = body["metadata"]
    try:
        wanted, invalid = observe_resource(body, allowed_images, settings), ""
    except TopologyError as exc:
        wanted, invalid = None, invalid_spec_message(exc)
    return Observation(
        metadata,
        int(metadata.get("generation") or 0),
        dict(body.get("spec") or {}),
        metadata.get("annotations") or {},
        wanted,
        invalid,
    )


def observe_resource(body: Mapping[str, Any], allowed_images: tuple[str, ...], settings: WorkerPodSettings) -> Topology:
    """The topology the resource asks for, or `TopologyError` saying why it cannot run here. Parsed before
    anything else walks the spec: a spec too deep or too big (an alias bomb) is one InvalidSpec line, where
    comparing it with the last one would have ended in RecursionError."""
    wanted = topology_from_resource(body)
    image = str(wanted.spec.get("image") or "")
    if image and not image_allowed(image, allowed_images):
        # before anything is created: no pod of a refused image, no ConfigMap or Secret for it
        raise TopologyError([image_refusal(image, allowed_images)])
    # likewise a placement outside the operator's policy (worker.placement): the control plane, another's nodes
    refused = placement_problems(wanted.spec.get("placement"), settings.placement, wanted.namespace)
    # and a podTemplate (or a connector's Secret) outside its policy (worker.podTemplate): hostPath, a mount
    # over the image's code, the operator's env or labels, a service account it did not allow
    refused += pod_template_problems(wanted.spec, settings)
    if refused:
        raise TopologyError(refused)
    return wanted


def invalid_spec_message(exc: TopologyError) -> str:
    return "; ".join(exc.problems)


@dataclass(frozen=True)
class PassContext:
    """One pass's view of a topology whose spec is valid (see the module)."""

    seen: Observation
    #: the pass's start (`Clock.monotonic`): settling and backoff are judged against it
    now: float
    #: the schedule the controller's workers run (`reading`; None: no controller yet, or it has none)
    schedule: Schedule | None = None
    #: what the controller knows of Redis (`reading`): why it is away ("" reachable), why the state is lost
    store_error: str = ""
    state_lost: str = ""

    @property
    def wanted(self) -> Topology:
        """The topology the resource asks for (a context is made for a valid spec only)."""
        assert self.seen.wanted is not None
        return self.seen.wanted

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.seen.metadata

    @property
    def generation(self) -> int:
        return self.seen.generation

    def reading(self, controller: TopologyController) -> PassContext:
        """This context with what runs now: the controller's schedule (None while it has none: suspended, or
        the backend cannot say) and its Redis facts, read from its memory (no round trip). The pass reads them
        again after a step that may change them (the controller's tick, a scaling)."""
        try:
            schedule: Schedule | None = controller.backend.current_schedule()
        except BackendError:
            schedule = None
        return dataclasses.replace(
            self, schedule=schedule, store_error=controller.store_error, state_lost=controller.state_lost
        )

    def running_schedule(self) -> Schedule:
        """The schedule that runs (`BackendError` when the controller has none)."""
        if self.schedule is None:
            raise BackendError("no schedule applied yet")
        return self.schedule
