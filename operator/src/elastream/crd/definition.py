"""The StreamTopology CRD as `elastream validate` reads it: the package's `streamtopology.yaml` (a symlink to
the repository's crds/streamtopology.yaml, the one copy kept by hand; the wheel holds the file itself), or
another CRD file named with `--crd`."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

CRD_FILE = "streamtopology.yaml"


def crd_text(path: str | None = None) -> str:
    """The CRD file as shipped in the package, or the file at `path`."""
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    return resources.files("elastream.crd").joinpath(CRD_FILE).read_text(encoding="utf-8")


@functools.cache
def crd(path: str | None = None) -> dict[str, Any]:
    """The CRD as a dict (the packaged one, or the one at `path`)."""
    document = yaml.safe_load(crd_text(path))
    if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path or CRD_FILE}: is not a CustomResourceDefinition")
    return document


def openapi_schema(version: str = "v1alpha1", path: str | None = None) -> dict[str, Any]:
    """The openAPIV3Schema of one served version of the CRD, as written."""
    for item in crd(path)["spec"]["versions"]:
        if item["name"] == version:
            schema = item["schema"]["openAPIV3Schema"]
            assert isinstance(schema, dict)
            return schema
    raise KeyError(f"the CRD serves no version {version}")
