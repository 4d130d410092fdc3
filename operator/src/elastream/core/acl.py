"""The Redis identity of one topology: its ACL user's name and rules (pure; `elastream.store.acl` applies them).

Every key of the topology NAMESPACE/NAME starts with `topology_prefix` (`elastream:{namespace/name}:`), so a
user whose key and channel patterns are that prefix (glob-escaped) followed by `*` reaches nothing of another
topology. Its commands are everything a worker sends (strings, hashes, lists, sets, streams, EVAL/EVALSHA,
SCRIPT LOAD/EXISTS, MULTI/EXEC/WATCH, the read-only slot map of a Redis Cluster) and nothing that lists the
keyspace, reads or changes the server, or reaches another client: `+@all -@dangerous -@admin`, then the
commands neither category holds that still list or affect other tenants, then the few subcommands of
CLIENT, ACL and CLUSTER a client library needs. Redis checks the same rules inside Lua scripts.

The rules were checked against redis-server 7.0 (`ACL CAT dangerous`, `ACL CAT admin`); every command named
exists there, since ACL SETUSER refuses unknown ones. Redis 6.2 (the embedded Redis of `elastream run`, many
managed services) has no functions and no CLUSTER SHARDS and cannot take a subcommand away (`-script|flush` is
a syntax error there), so its rules (`REDIS_6_COMMAND_RULES`) remove SCRIPT and give back LOAD and EXISTS, and
name only what 6.2 has. Redis before 6.2 (no channel rules) is not supported.
"""

from __future__ import annotations

from elastream.core.topology import glob_escape, topology_prefix

#: the first part of every topology user's name
USER_PREFIX = "elastream"

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
    # other tenants' code and scripts: functions, SCRIPT FLUSH/KILL (KILL stops another client's script)
    "-function",
    "-fcall",
    "-fcall_ro",
    "-script|flush",
    "-script|kill",
    "-script|debug",
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


#: the same for Redis 6.2: no FUNCTION/FCALL and no CLUSTER SHARDS there, and no `-command|subcommand`
REDIS_6_COMMAND_RULES: tuple[str, ...] = (
    *(
        rule
        for rule in TOPOLOGY_COMMAND_RULES
        if rule not in ("-function", "-fcall", "-fcall_ro", "+cluster|shards") and not rule.startswith("-script|")
    ),
    "-script",
    "+script|load",
    "+script|exists",
)


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
