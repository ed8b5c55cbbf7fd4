"""Fencing every Redis write of a job by its lease's epoch, checked inside Redis.

A job's driver writes under its lease (`jobs.core.lease`): epoch e, a number that grows with every new holder. A
driver that was paused (SIGSTOP, a long GC, a frozen VM) may wake after another driver took the lease over (e+1)
and go on writing the batch it had in flight. The fence stops those writes in Redis itself:

- The fence `Fence(name, epoch)`: `name` the job (`mv:fence:<job>:...`), `epoch` the writer's lease epoch (0: no
  lease; such a writer is refused once any holder raised the fence).
- Its keys: one per hash slot the job writes, so a script can read it beside the data keys of that slot on a Redis
  Cluster (a script touches one slot): `mv:fence:<name>:{?}` on one server, `mv:fence:<name>:{<tag>}` on a cluster
  for each of its 16384 slots (`<tag>` a short text that hashes to the slot, `views.redis_io.slot_tag`). Commands
  are built with the `{?}` form; `views.redis_io.Forwarder` puts each command's slot tag in its place on a cluster.
- A new holder raises the fence to its epoch before its first write (`raise_fence`: every slot's key on a cluster,
  one pipelined script call per slot); a fence already above its epoch raises `Fenced` (it is stale itself).
- Every write of every view kind is one call of a script that reads the fence and refuses the whole call (nothing
  applied, the error reply `FENCED ...`, raised as `views.errors.Fenced`) when the caller's epoch is below it, and
  otherwise applies the call's commands, all in one atomic step: `GATE_LUA` runs the commands it is given (a list
  operation's DEL, ZREM, ZADD and trim; a row's HSET or HDEL; a body's SET or DEL; ...), `views.count.COUNT_LUA`
  checks the fence the same way, `fenced_call` sends one gated command from the driver (the generation pointer),
  `jobs.core.generations.record_batch` checks it in its own script.

Since a write and its fence check are one script call, a stale driver's write either lands before the new holder
raised the fence (and the new holder, which replays the batch from the lake's checkpoint and writes every key it
touches, overwrites it in order) or is refused. The check costs one GET per call, in the same script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from redis.cluster import RedisCluster
from redis.crc import key_slot

from views.redis_io import FENCE_ANY_SLOT, Forwarder, pack, send_packed, slot_tag

__all__ = ["Fence", "UNFENCED", "GATE_LUA", "GATE_SHA", "raise_fence", "fenced_call", "is_cluster_client"]

# KEYS[1] = the fence, KEYS[2] = the key the commands write; ARGV[1] = the caller's epoch, then per command: its
# number of arguments n, then the command's n arguments (its name first). A command with more than 7000 arguments
# (ZADD, ZREM, SADD, SREM of many members) is called in parts of 6000 members after its name and key (Lua's unpack
# has a limit; 6000 keeps ZADD's score-member pairs whole).
GATE_LUA = """
local f = redis.call('GET', KEYS[1])
if f and tonumber(f) > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED: epoch ' .. ARGV[1] .. ' is below the fence ' .. f .. ' of ' .. KEYS[1])
end
local i = 2
while i <= #ARGV do
  local last = i + tonumber(ARGV[i])
  if last - i <= 7000 then
    redis.call(unpack(ARGV, i + 1, last))
  else
    local j = i + 3
    while j <= last do
      local e = math.min(j + 5999, last)
      redis.call(ARGV[i + 1], ARGV[i + 2], unpack(ARGV, j, e))
      j = e + 1
    end
  end
  i = last + 1
end
return 1
"""
GATE_SHA = hashlib.sha1(GATE_LUA.encode()).hexdigest()

# KEYS[1] = a fence key; ARGV[1] = the new holder's epoch. Raises the fence to it; refuses when it is higher.
RAISE_LUA = """
local f = redis.call('GET', KEYS[1])
if f and tonumber(f) > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED: epoch ' .. ARGV[1] .. ' is below the fence ' .. f .. ' of ' .. KEYS[1])
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
_RAISE_SHA = hashlib.sha1(RAISE_LUA.encode()).hexdigest()


@dataclass(frozen=True)
class Fence:
    """The fence a writer's calls carry: the job's fence `name` and the writer's lease `epoch` (see the module
    docstring)."""

    name: str
    epoch: int

    @property
    def key(self) -> str:
        """The fence key as commands name it: `mv:fence:<name>:{?}` (a cluster's Forwarder sets each slot's tag)."""
        return f"mv:fence:{self.name}:{FENCE_ANY_SLOT}"

    def key_for(self, key: str, cluster: bool) -> str:
        """The fence key a call writing `key` names: on a cluster, the one in `key`'s hash slot."""
        if not cluster:
            return self.key
        return f"mv:fence:{self.name}:{{{slot_tag(key_slot(key.encode())).decode()}}}"


# The fence of a writer without a lease: epoch 0 of a fence no holder raises, so its writes always apply.
UNFENCED = Fence("-", 0)


def is_cluster_client(client) -> bool:
    """Whether `client` is a Redis Cluster client (its fence keys are per slot)."""
    return isinstance(client, RedisCluster)


def raise_fence(client, fence: Fence) -> None:
    """Raise `fence`'s keys (every slot's on a Redis Cluster) to its epoch, before its holder's first write. Raises
    `views.errors.Fenced` when a fence key is above the epoch already (another holder took over)."""
    if fence.epoch <= 0:
        return
    what = f"raising the fence {fence.name} to epoch {fence.epoch}"
    if not isinstance(client, RedisCluster):
        send_packed(
            client, pack("EVALSHA", _RAISE_SHA, 1, fence.key, fence.epoch), 1, scripts=(RAISE_LUA,), what=what
        )
        return
    with Forwarder(client, what=what, scripts=(RAISE_LUA,)) as out:
        for slot in range(16384):
            tag = slot_tag(slot)
            key = b"mv:fence:%s:{%s}" % (fence.name.encode(), tag)
            out.add(pack("EVALSHA", _RAISE_SHA, 1, key, fence.epoch), 1, b"{%s}" % tag)


def fenced_call(client, fence: Fence, key: str, *command, what: str) -> None:
    """Send one command writing `key` (`command`: its name and arguments, `key` among them) through the gate,
    from this process. Raises `views.errors.Fenced` when the fence refuses it."""
    payload = pack("EVALSHA", GATE_SHA, 2, fence.key, key, fence.epoch, len(command), *command)
    if isinstance(client, RedisCluster):
        with Forwarder(client, what=what, scripts=(GATE_LUA,)) as out:
            out.add(payload, 1, key)
        return
    send_packed(client, payload, 1, scripts=(GATE_LUA,), what=what)
