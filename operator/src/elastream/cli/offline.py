"""Offline commands on manifests and snapshots: validate (etp, plan and simulate follow)."""

from __future__ import annotations

import argparse

from elastream.core.topology import load_manifest


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = subparsers.add_parser("validate", help="check a StreamTopology manifest")
    validate.add_argument("file", help="YAML file with one StreamTopology")
    validate.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    topology = load_manifest(args.file)
    print(
        f"{args.file}: valid — topology {topology.name}: {len(topology.vertices)} vertices, "
        f"{len(topology.streams)} streams, {topology.executors} executors on {topology.nodes} nodes "
        f"× {topology.slots_per_node} slots"
    )
    return 0
