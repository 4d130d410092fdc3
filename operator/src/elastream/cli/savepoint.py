"""`elastream savepoint list|delete`: the savepoints kept in Redis, also those of a topology deleted since
(on Kubernetes a running topology's are in its status.savepoints, and the annotation
elastream.dev/delete-savepoint deletes one of them)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import redis

from elastream.cli import CommandError
from elastream.cli.analyze import _redis_client, _unreachable
from elastream.core.savepoint_rules import name_problem
from elastream.store.savepoint_store import SavepointStore


def register(subparsers: Any) -> None:
    savepoint = subparsers.add_parser("savepoint", help="list or delete the savepoints of a topology")
    actions = savepoint.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in (("list", "list a topology's savepoints"), ("delete", "delete one savepoint")):
        parser = actions.add_parser(action, help=help_text)
        if action == "delete":
            parser.add_argument("name", help="the savepoint to delete")
        parser.add_argument("--topology", required=True, help="the topology that took it (its metadata.name)")
        parser.add_argument("--namespace", default="default", help="its namespace (default: default)")
        parser.add_argument(
            "--redis", default=os.environ.get("ELASTREAM_REDIS_URL"), help="Redis URL (default ELASTREAM_REDIS_URL)"
        )
        if action == "list":
            parser.add_argument("--json", action="store_true", help="print JSON (status.savepoints' shape)")
        parser.set_defaults(func=cmd_savepoint)


def cmd_savepoint(args: argparse.Namespace) -> int:
    for value, where in ((args.topology, "--topology"), (args.namespace, "--namespace")):
        problem = name_problem(value, where)
        if problem is not None:
            raise CommandError(problem)
    if not args.redis:
        raise CommandError("--redis: no Redis URL; give --redis URL or set ELASTREAM_REDIS_URL")
    store = SavepointStore(_redis_client(args.redis), args.namespace, args.topology)
    try:
        if args.action == "delete":
            if not store.delete(args.name):
                raise CommandError(f"no savepoint {args.name} of {args.namespace}/{args.topology}")
            print(f"savepoint {args.name} of {args.namespace}/{args.topology} deleted")
            return 0
        found = store.list()
    except redis.RedisError as exc:
        raise _unreachable(args.redis, exc) from None
    if args.json:
        print(json.dumps([m.to_status() for m in found], indent=1))
    elif not found:
        print(f"no savepoint of {args.namespace}/{args.topology}")
    for meta in [] if args.json else found:
        shared = f" shared with {','.join(meta.shared_with)}" if meta.shared_with else ""
        print(f"{meta.name}\t{meta.taken_at}\t{meta.checkpoint}\t{meta.state_bytes} bytes{shared}")
    return 0
