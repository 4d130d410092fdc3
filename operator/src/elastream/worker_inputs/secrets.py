"""A connector's `secretRef`, as a worker reads it: the Secret's keys are files of a directory, one per key, the
way Kubernetes mounts a Secret volume. The operator mounts each Secret a topology's connectors name at
`/etc/elastream/secrets/<name>/` in its worker pods, read-only; `ELASTREAM_SECRETS_DIR` moves the root (local
worker processes, tests). The operator itself never reads a Secret's data.

What is read here is never logged, and errors name the Secret and the key, never a value."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

#: where the Secrets of a topology's connectors are mounted in its worker pods
DEFAULT_SECRETS_DIR = "/etc/elastream/secrets"

#: a Secret's name (DNS-1123 subdomain, as the CRD's `secretRef.name` pattern) and a key of it (Kubernetes' own
#: rule for Secret keys); anything else is never turned into a path
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_KEY = re.compile(r"[-._a-zA-Z0-9]+")
#: the most bytes one key's file may hold (a CA bundle is a few kilobytes; a Secret is at most 1 MiB)
MAX_VALUE_BYTES = 1 << 20


class SecretUnavailable(Exception):
    """The Secret a connector names cannot be read: its message names the Secret (and key) and the fix."""


def secrets_dir(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("ELASTREAM_SECRETS_DIR") or DEFAULT_SECRETS_DIR


def secret_properties(name: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Every key of the mounted Secret `name` and its value as text (a trailing newline removed, as `kubectl
    create secret --from-file` leaves it). Kubernetes' own files of the mount (`..data`, hidden) are skipped."""
    if not _NAME.fullmatch(name) or len(name) > 253:
        raise SecretUnavailable(f"secretRef.name {name[:60]!r} is not a Secret name; use a DNS-1123 name")
    directory = os.path.join(secrets_dir(environ), name)
    if not os.path.isdir(directory):
        raise SecretUnavailable(
            f"Secret {name!r} is not mounted at {directory}: create it in the topology's namespace "
            "(kubectl create secret generic ...); the operator mounts every secretRef into the worker pods"
        )
    properties: dict[str, str] = {}
    for key in sorted(os.listdir(directory)):
        path = os.path.join(directory, key)
        if key.startswith(".") or not _KEY.fullmatch(key) or not os.path.isfile(path):
            continue
        if os.path.getsize(path) > MAX_VALUE_BYTES:
            raise SecretUnavailable(f"Secret {name!r} key {key!r} is over {MAX_VALUE_BYTES} bytes; shorten it")
        try:
            with open(path, encoding="utf-8") as file:
                value = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretUnavailable(
                f"Secret {name!r} key {key!r} cannot be read as UTF-8 text ({type(exc).__name__})"
            ) from None
        properties[key] = value[:-1] if value.endswith("\n") else value
    return properties
