"""The topology's Redis identity without a Redis: its user's name and rules (`core.acl`) and the URL its
workers get (`store.acl.topology_url`), which must keep everything of the operator's URL but the user info."""

from __future__ import annotations

import pytest

from elastream.core.acl import TOPOLOGY_COMMAND_RULES, topology_acl_rules, topology_user
from elastream.store.acl import AclRefused, _refused, topology_url
from elastream.store.registry import redacted

USER, PASSWORD = "elastream.prod.pay-ments.v2", "f" * 64


def test_the_user_name_splits_back_into_namespace_and_name() -> None:
    user = topology_user("prod", "pay-ments.v2")
    assert user == USER
    _, namespace, name = user.split(".", 2)
    assert (namespace, name) == ("prod", "pay-ments.v2")


def test_the_rules_confine_keys_and_channels_to_the_prefix_and_take_away_what_lists_or_reaches_others() -> None:
    rules = topology_acl_rules("prod", "payments", PASSWORD)
    assert rules[:3] == ["reset", "on", f">{PASSWORD}"]
    assert "~elastream:{prod/payments}:*" in rules
    assert rules.index("resetchannels") < rules.index("&elastream:{prod/payments}:*")
    assert not any(r.startswith("~") and r != "~elastream:{prod/payments}:*" for r in rules)
    assert "allkeys" not in rules and "allchannels" not in rules
    assert rules[rules.index("&elastream:{prod/payments}:*") + 1 :] == list(TOPOLOGY_COMMAND_RULES)
    for denied in ("-@dangerous", "-scan", "-randomkey", "-dbsize", "-keys", "-flushall", "-config", "-info",
                   "-pubsub", "-memory", "-function", "-script", "-select", "-migrate", "-restore"):  # fmt: skip
        assert denied in TOPOLOGY_COMMAND_RULES, denied
    assert TOPOLOGY_COMMAND_RULES.index("-acl") < TOPOLOGY_COMMAND_RULES.index("+acl|whoami")
    assert TOPOLOGY_COMMAND_RULES.index("-cluster") < TOPOLOGY_COMMAND_RULES.index("+cluster|slots")


def test_redis_6_rules_name_only_what_6_2_has_and_take_away_the_same() -> None:
    from elastream.core.acl import REDIS_6_COMMAND_RULES

    rules = topology_acl_rules("prod", "payments", PASSWORD, server_major=6)
    assert rules[rules.index("&elastream:{prod/payments}:*") + 1 :] == list(REDIS_6_COMMAND_RULES)
    # 6.2 cannot take a subcommand away, and has no functions nor CLUSTER SHARDS (ACL SETUSER refuses them)
    assert not any(r.startswith("-") and "|" in r for r in REDIS_6_COMMAND_RULES)
    assert not {"-function", "-fcall", "-fcall_ro", "+fcall", "+cluster|shards"} & set(REDIS_6_COMMAND_RULES)
    # no scripts there either: EVAL, EVALSHA and SCRIPT (all of it) taken, nothing of them given back
    assert {"-@scripting", "-eval", "-evalsha", "-script"} <= set(REDIS_6_COMMAND_RULES)
    assert not any(r.startswith(("+script", "+eval", "+@scripting")) for r in REDIS_6_COMMAND_RULES)
    seven = set(TOPOLOGY_COMMAND_RULES) - {"-function", "-fcall", "-fcall_ro", "-eval_ro", "-evalsha_ro"}
    assert seven - {"+cluster|shards", "+fcall"} <= set(REDIS_6_COMMAND_RULES)  # every other denial kept
    assert topology_acl_rules("a", "b", PASSWORD, server_major=8) == topology_acl_rules("a", "b", PASSWORD)


def test_a_glob_character_in_the_prefix_is_escaped() -> None:
    # names are DNS labels (no glob characters); the escape is there should that ever change
    assert "~elastream:{a/b\\*}:*" in topology_acl_rules("a", "b*", PASSWORD)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:adm1n@redis:6379/0", f"redis://{USER}:{PASSWORD}@redis:6379/0"),
        ("redis://redis", f"redis://{USER}:{PASSWORD}@redis"),
        (
            "rediss://default:p%40ss@redis.prod.svc:6380/2?ssl_ca_certs=/etc/elastream/ca.pem&ssl_cert_reqs=required",
            f"rediss://{USER}:{PASSWORD}@redis.prod.svc:6380/2?ssl_ca_certs=/etc/elastream/ca.pem&ssl_cert_reqs=required",
        ),
        (
            "redis+cluster://op:s3cret@h1:7000,h2:7001,[::1]:7002",
            f"redis+cluster://{USER}:{PASSWORD}@h1:7000,h2:7001,[::1]:7002",
        ),
        (
            "rediss+cluster://h1:7000/?ssl_ca_certs=/ca.pem",
            f"rediss+cluster://{USER}:{PASSWORD}@h1:7000/?ssl_ca_certs=/ca.pem",
        ),
        ("unix:///run/redis.sock?db=3&password=adm1n", f"unix://{USER}:{PASSWORD}@/run/redis.sock?db=3"),
        ("unix://:adm1n@/run/redis.sock", f"unix://{USER}:{PASSWORD}@/run/redis.sock"),
        ("redis://:a/b?c@redis:6379/0", f"redis://{USER}:{PASSWORD}@redis:6379/0"),  # an unencoded / and ? in it
    ],
)
def test_the_workers_url_is_the_operators_with_the_topologys_user(url: str, expected: str) -> None:
    got = topology_url(url, USER, PASSWORD)
    assert got == expected
    assert "adm1n" not in got and "s3cret" not in got and "p%40ss" not in got
    assert PASSWORD not in redacted(got)


def test_a_refusal_names_the_fix_and_never_a_rule() -> None:
    import redis

    refused = _refused(
        "GETUSER", redis.exceptions.NoPermissionError("this user has no permissions to run the 'acl|getuser' command")
    )
    assert isinstance(refused, AclRefused)
    assert "+acl" in str(refused) and "--redis-topology-users off" in str(refused) and "acl|getuser" in str(refused)
    leaky = _refused("SETUSER", redis.ResponseError(f"Error in ACL SETUSER modifier '>{PASSWORD}': Syntax error"))
    assert PASSWORD not in str(leaky) and PASSWORD not in leaky.reason


@pytest.mark.parametrize("server_major", [6, 7, 8])
def test_no_topology_user_runs_code_on_the_server(server_major: int) -> None:
    """A script that writes and then loops holds every client of the Redis at BUSY until SHUTDOWN NOSAVE (SCRIPT
    KILL refuses it once it wrote): tenants get no EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FUNCTION, FCALL or
    FCALL_RO, by category and by name, and nothing later gives any of them (or a subcommand) back but FCALL on
    Redis 7 (the functions only the operator may load: its commit, run as the topology's user)."""
    from elastream.core.acl import REDIS_7_ONLY, SCRIPTING_COMMANDS

    rules = topology_acl_rules("prod", "payments", PASSWORD, server_major=server_major)
    commands = rules[rules.index("&elastream:{prod/payments}:*") + 1 :]
    scripting = {"eval", "evalsha", "eval_ro", "evalsha_ro", "script", "function", "fcall", "fcall_ro"}
    assert {f"-{c}" for c in scripting} == set(SCRIPTING_COMMANDS)
    expected = {"-@scripting"} | {f"-{c}" for c in scripting}
    if server_major < 7:  # 6.2 knows only EVAL, EVALSHA and SCRIPT (ACL SETUSER refuses the others)
        expected -= REDIS_7_ONLY
    assert expected <= set(commands)
    last = max(commands.index(rule) for rule in expected)
    assert commands.index("+@all") < commands.index("-@scripting") <= last
    given_back = [r for r in commands[commands.index("-@scripting") :] if r.startswith("+")]
    code = [r for r in given_back if r[1:].split("|")[0] in scripting or r == "+@scripting"]
    assert code == (["+fcall"] if server_major >= 7 else []), given_back
    if server_major >= 7:  # FCALL of what the operator loaded; never a FUNCTION LOAD of its own
        assert "-function" in commands and commands.index("-function") > commands.index("+@all")
