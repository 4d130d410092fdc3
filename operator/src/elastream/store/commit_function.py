"""The commit of exactly-once sinks' staged output, as a Redis Function the operator loads and runs as the
topology's own Redis user.

A checkpoint's completion moves what each exactly-once sink staged under the checkpoint's transaction
(`P txn:<id>:<v>#<i>`, one list per sink executor) into the sink's stream and deletes the lists, atomically
with making the checkpoint the latest (`store.checkpoint_store.CheckpointStore.complete_checkpoint`). Every key it
touches is derived from the topology's prefix and spec, and the code checks the prefix; on top of that, where
the operator gives each topology a Redis ACL user (the default on Kubernetes), the whole completion runs on a
connection logged in as that user, so Redis itself refuses any key outside the topology's pattern: a bug in
how the operator derives a name could still not reach another topology.

A topology's user may not EVAL (a script that writes and then loops holds the server at BUSY, and SCRIPT KILL
cannot stop it), so the commit runs as a function: FCALL runs only what FUNCTION LOAD loaded, and only the
operator may load (a topology user has no FUNCTION). The function is the operator's, bounded by the lists it is
given. Redis before 7.0 has no functions: there the same Lua runs by EVAL on the operator's connection, the
names derived and prefix-checked by the script as above, with no ACL behind them.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

log = logging.getLogger("elastream.checkpoint")

#: the library's name; its functions carry a version, so an operator of another version loads its own beside it
LIBRARY = "elastream"
COMMIT_FUNCTION = "elastream_commit_v1"

#: Commits one transaction: moves the staging lists of each exactly-once sink into that sink's stream and
#: deletes them and the transaction's set. Every key is the operator's: KEYS[1] the set `P txn:<id>`, then per
#: sink its stream followed by its staging lists `P txn:<id>:<v>#<i>`; ARGV[1] the topology's prefix (every key
#: must start with it), then per sink how many staging lists follow its stream. A list holds a stream name
#: (what the sink wrote: ignored, the stream is the one passed) then id, key, value, ts per event (what
#: `RedisStreamSink.pre_commit` writes); a list that is not one, or a trailing incomplete event, is skipped.
COMMIT_SCRIPT = """
local prefix = ARGV[1]
for i = 1, #KEYS do
  if string.sub(KEYS[i], 1, #prefix) ~= prefix then
    return redis.error_reply('ERR elastream commit: key outside the topology prefix')
  end
end
local k = 2
for s = 2, #ARGV do
  local kind = redis.call('TYPE', KEYS[k])['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('ERR elastream commit: the sink stream ' .. KEYS[k] .. ' is a ' .. kind)
  end
  k = k + 1 + tonumber(ARGV[s])
end
local moved = 0
k = 2
for s = 2, #ARGV do
  local stream = KEYS[k]
  local n = tonumber(ARGV[s])
  for j = k + 1, k + n do
    if redis.call('TYPE', KEYS[j])['ok'] == 'list' then
      local items = redis.call('LRANGE', KEYS[j], 0, -1)
      for i = 2, #items - 3, 4 do
        redis.call('XADD', stream, '*', 'id', items[i], 'key', items[i + 1], 'value', items[i + 2],
                   'ts', items[i + 3])
        moved = moved + 1
      end
    end
    redis.call('DEL', KEYS[j])
  end
  k = k + n + 1
end
redis.call('DEL', KEYS[1])
return moved
"""

#: the library FUNCTION LOAD takes: the same Lua as a function of the keys and arguments
LIBRARY_SOURCE = (
    f"#!lua name={LIBRARY}\nredis.register_function('{COMMIT_FUNCTION}', function(KEYS, ARGV)\n{COMMIT_SCRIPT}\nend)\n"
)


def ensure_library(node: Any) -> bool:
    """Make sure the commit function is loaded on the Redis node `node` (a client of the primary that holds
    the topology's keys; a cluster's replicas get it by replication): asked before every completion
    (FUNCTION LIST, read-only, not replicated), loaded when missing (a Redis restarted without its data, a
    slot moved to a primary that never had it). Asking first matters: inside the completion's MULTI an FCALL
    of an unknown function fails alone while the rest applies, and the staged output would go uncommitted.
    False when the server has no functions (before 7.0): the commit goes by EVAL. Other refusals (no FUNCTION
    for the operator's own user) raise `redis.ResponseError`."""
    try:
        listed = node.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY)
    except redis.ResponseError as exc:
        if "unknown command" in str(exc).lower():
            return False
        raise
    if COMMIT_FUNCTION not in _names(listed):
        node.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY_SOURCE)
        log.info("loaded the Redis Function library %s (%s)", LIBRARY, COMMIT_FUNCTION)
    return True


def _names(reply: Any) -> set[str]:
    """Every string of a nested FUNCTION LIST reply (lists, or maps as redis-py may parse them)."""
    found: set[str] = set()
    stack = [reply]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes | str):
            found.add(item.decode(errors="replace") if isinstance(item, bytes) else item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found
