"""The Redis identity of one topology: its ACL user's name and rules (pure; `elastream.store.acl` applies them).

Every key of the topology NAMESPACE/NAME starts with `topology_prefix` (`elastream:{namespace/name}:`), so a
user whose key and channel patterns are that prefix (glob-escaped) followed by `*` reaches nothing of another
topology. Its commands are everything a worker sends (strings, hashes, lists, sets, streams, MULTI/EXEC/WATCH,
the read-only slot map of a Redis Cluster) and nothing that lists the keyspace, reads or changes the server,
reaches another client or runs code on the server: `+@all -@dangerous -@admin`, then the commands neither
category holds that still list or affect other tenants, then the few subcommands of CLIENT, ACL and CLUSTER a
client library needs.

No code of its own on the server (`-@scripting`, and EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FUNCTION,
FCALL_RO by name): Redis runs one script at a time and serves nobody meanwhile, and a script that has written
and then loops cannot be stopped (SCRIPT KILL and FUNCTION KILL refuse once it wrote; only SHUTDOWN NOSAVE ends
it), so one tenant's EVAL could hold every client of a shared Redis at BUSY. What a worker needs done
atomically on the server is a MULTI/EXEC transaction (the at-least-once sink's token-guarded batch, an
exactly-once sink's staging). FCALL alone is given back (Redis 7): it runs only functions loaded by FUNCTION
LOAD, which only the operator may run, and the operator runs a checkpoint's commit as the topology's user
through it (`store.commit_function`), so Redis' ACLs bound that commit to the topology's keys. The operator's
other scripts run on its own connection.

The rules were checked against redis-server 7.0 (`ACL CAT dangerous`, `ACL CAT admin`, `ACL CAT scripting`);
every command named exists there, since ACL SETUSER refuses unknown ones. Redis 6.2 (the embedded Redis of
`elastream run`, many managed services) has no functions, no EVAL_RO/EVALSHA_RO and no CLUSTER SHARDS, and
cannot take a subcommand away (`-script|flush` is a syntax error there), so its rules (`REDIS_6_COMMAND_RULES`)
name only what 6.2 has; `-@scripting` there takes EVAL, EVALSHA and SCRIPT. Redis before 6.2 (no channel rules)
is not supported.
"""

from __future__ import annotations

from elastream.core.topology import glob_escape, topology_prefix

#: the first part of every topology user's name
USER_PREFIX = "elastream"

#: the commands that run code on the server (Redis 7.0's `ACL CAT scripting`), taken away by name as well as by
#: category, whatever a later Redis files them under
SCRIPTING_COMMANDS: tuple[str, ...] = (
    "-eval",
    "-evalsha",
    "-eval_ro",
    "-evalsha_ro",
    "-script",
    "-function",
    "-fcall",
    "-fcall_ro",
)

#: given back after `SCRIPTING_COMMANDS` on Redis 7: FCALL of the functions the operator loaded (see the module)
OPERATOR_FUNCTIONS = "+fcall"

#: the commands of Redis 7 that Redis 6.2 does not know (its ACL SETUSER refuses them)
REDIS_7_ONLY = frozenset(
    {"-eval_ro", "-evalsha_ro", "-function", "-fcall", "-fcall_ro", OPERATOR_FUNCTIONS, "+cluster|shards"}
)

#: what a topology's user may run, in order (later rules override earlier ones)
TOPOLOGY_COMMAND_RULES: tuple[str, ...] = (
    "+@all",
    # KEYS, INFO, FLUSHALL/FLUSHDB, SWAPDB, CONFIG, DEBUG, MONITOR, CLIENT LIST/KILL/PAUSE, ACL SETUSER and
    # the other ACL writes and reads, MIGRATE, RESTORE, SORT (BY/GET patterns), the CLUSTER admin commands,
    # SHUTDOWN, replication, modules, latency and slowlog
    "-@dangerous",
    "-@admin",
    # listing the keyspace, or reaching keys of another database
    "-scan",
    "-randomkey",
    "-dbsize",
    "-select",
    "-move",
    "-copy",
    # code run on the server: a script or function that wrote and then loops holds every client at BUSY until
    # SHUTDOWN NOSAVE (SCRIPT KILL refuses it); and SCRIPT FLUSH/KILL reach other clients' scripts
    "-@scripting",
    *SCRIPTING_COMMANDS,
    OPERATOR_FUNCTIONS,
    # who publishes and subscribes to what (PUBSUB CHANNELS / NUMSUB / NUMPAT / SHARD*)
    "-pubsub",
    # the server's memory, per key or in total
    "-memory",
    # other clients (tracking invalidations included); a connection may still name and inspect itself
    "-client",
    "+client|id",
    "+client|getname",
    "+client|setname",
    "+client|info",
    # every ACL subcommand but WHOAMI
    "-acl",
    "+acl|whoami",
    # a Redis Cluster client reads the slot map and the nodes; nothing else of CLUSTER
    "-cluster",
    "+cluster|slots",
    "+cluster|shards",
    "+cluster|nodes",
    # explicit, whatever a later Redis files them under
    "-keys",
    "-info",
    "-flushall",
    "-flushdb",
    "-swapdb",
    "-config",
    "-debug",
    "-monitor",
    "-migrate",
    "-restore",
)


#: the same for Redis 6.2: no FUNCTION/FCALL, EVAL_RO/EVALSHA_RO nor CLUSTER SHARDS there, and no
#: `-command|subcommand` (none of the 7.0 rules takes one away)
REDIS_6_COMMAND_RULES: tuple[str, ...] = tuple(rule for rule in TOPOLOGY_COMMAND_RULES if rule not in REDIS_7_ONLY)


def command_rules(server_major: int) -> tuple[str, ...]:
    """The command rules for a Redis whose major version is `server_major` (6: 6.2's; 7 and later: 7.0's)."""
    return REDIS_6_COMMAND_RULES if server_major < 7 else TOPOLOGY_COMMAND_RULES


def topology_user(namespace: str, name: str) -> str:
    """The ACL user of the topology NAMESPACE/NAME: `elastream.<namespace>.<name>`. A namespace (a DNS-1123
    label) has no dots, so the first two dots split it back; every character is one a URL's user info holds
    as it is."""
    return f"{USER_PREFIX}.{namespace}.{name}"


def topology_acl_rules(namespace: str, name: str, password: str, server_major: int = 7) -> list[str]:
    """The arguments of `ACL SETUSER <user>` that make the topology's user what it must be, whatever it was:
    reset, on, its one password, its keys and channels, its commands (for a Redis of major version
    `server_major`)."""
    pattern = f"{glob_escape(topology_prefix(namespace, name))}*"
    rules = command_rules(server_major)
    return ["reset", "on", f">{password}", f"~{pattern}", "resetchannels", f"&{pattern}", *rules]
