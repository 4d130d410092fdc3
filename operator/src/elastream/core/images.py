"""The operator's allow-list of worker images (the chart's `worker.allowedImages`, `--allowed-image`): which
`spec.image` a StreamTopology may run. Pure, so the matching rules are unit-tested.

An entry matches an image written exactly as the topology writes it (no registry or `library/` is added):
- with a `*`: a glob over the whole reference, `*` matching any characters, `/` included
  (`registry.example.com/streams/*`);
- ending in `/`: every image under that path (`registry.example.com/streams/`);
- otherwise a repository: that repository with any tag or digest, or the entry itself as written
  (`registry.example.com/streams/worker` allows `…/worker:1.2` and `…/worker@sha256:…`, not `…/worker-evil`).
An empty list allows every image.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence


def image_allowed(image: str, allowed: Sequence[str]) -> bool:
    """Whether `image` may run under the allow-list `allowed` (empty: any image)."""
    if not allowed:
        return True
    for entry in allowed:
        if "*" in entry:
            if fnmatch.fnmatchcase(image, entry):
                return True
        elif entry.endswith("/"):
            if image.startswith(entry) and len(image) > len(entry):
                return True
        elif image == entry or image.startswith((f"{entry}:", f"{entry}@")):
            return True
    return False


def image_refusal(image: str, allowed: Sequence[str]) -> str:
    """The one line an image outside the allow-list gets (an InvalidSpec condition and event)."""
    return (
        f"spec.image: {image!r} is not an allowed worker image (the operator allows {', '.join(allowed)}); "
        "use an image the list allows, or have the operator's worker.allowedImages extended"
    )
