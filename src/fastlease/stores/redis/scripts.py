"""Redis: where a key's lease, fencing counter, idempotency record and release channel live, and the
scripts that run each protocol step on them, atomic on the server.

**Layout.** For lock table ``T`` and key ``K`` (the table name cannot contain ``:``, so namespaces never
collide whatever ``K`` holds):

* ``fastlease:T:lease:K``, a hash: ``owner``, ``version``, ``lease_ms``, ``protocol`` (1), ``fence``,
  and ``waiting`` ("1") once a contender has marked it. Its PX is the holder's ``lease_ms``, reset by
  every write of the holder (acquire, takeover, renew), so a crashed holder's lease disappears by
  expiry, before any contender's observation wait ends. Safe, because ownership ends at 90% of the
  lease counted from before the write: the key always outlives the holder's own validity, as long as
  the server's clock does not run more than 10% fast over a lease (see the failure model).
* ``fastlease:T:fence:K``, a counter that never expires: every acquisition and takeover INCRs it in
  the same script and stores the result in the hash, so fencing tokens strictly increase per key,
  across release, takeover and expiry. (It survives a server restart only with persistence on.)
* ``fastlease:T:line:K`` and ``fastlease:T:alive:K``, the key's line of waiters: a sorted set of waiter
  ids by arrival (the server's clock, in µs), and a hash of each one's liveness deadline (the server's
  clock, in ms), which every read of the waiter pushes ``ALIVE_MS`` ahead. The first waiter whose
  deadline has not passed has the turn: an acquisition by anyone else is refused while the key is free,
  and a release wakes that waiter alone, or hands the lease over to it where its last read offered to
  take it (``<waiter> offer`` in the hash; see HAND_OVER). A dead or departed waiter is dropped when its
  deadline passes. Both keys expire ``2 * ALIVE_MS`` after the last read of any waiter, so an abandoned
  line vanishes.
* ``fastlease:T:released:K``, the pub/sub channel that release publishes on (see ``RedisReleaseFeed``):
  ``1`` (anyone may look) when nobody waits in line. A message that gives a waiter its turn names it, and
  goes to its client's turn channel, ``fastlease:T:released:K~C`` for a waiter id ``C~...`` (C: the hex
  token of one client, one store object), so that only that client reads it, not every client that waits
  for the key (see TURN_CHANNEL). An id without such a token (a client of an earlier version) has its turns
  on the key's channel.
"""

from __future__ import annotations

from .._digest import constructor
from ..base import LINE_ALIVE_MS

_sha1 = constructor("sha1")  # EVALSHA's name of a script, without loading OpenSSL (see _digest)

PREFIX = "fastlease"

ALIVE_MS = LINE_ALIVE_MS  # how long a waiter keeps its place after its last read (stores/base.py)

# ---------------------------------------------------------------------------------------------
# The scripts. Each one is the whole of one protocol step, atomic on the server. They check
# everything before their first write (a script that fails halfway is not rolled back), and
# compare owner and version as exact byte strings.
# ---------------------------------------------------------------------------------------------

#: The head of a key's line (KEYS: line, alive): the first waiter whose liveness deadline has not
#: passed, or nil. Waiters found dead on the way are dropped. Prepended to the scripts that use it.
NEXT_IN_LINE = """
local function next_in_line(line, alive)
  local now
  for _ = 1, redis.call('ZCARD', line) do
    local head = redis.call('ZRANGE', line, 0, 0)[1]
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local alive_until = tonumber(redis.call('HGET', alive, head))
    if alive_until and alive_until > now then return head end
    redis.call('ZREM', line, head)
    redis.call('HDEL', alive, head, head .. ' offer')
  end
  return nil
end
"""

#: The channel that gives ``waiter`` its turn: its client's turn channel, ``channel`` followed by "~" and the
#: client's token, where the id starts with that token and a "~"; else ``channel`` itself (an id from a
#: client of an earlier version, which listens there only). Prepended to the scripts that use it.
TURN_CHANNEL = """
local function turn_channel(channel, waiter)
  local client = string.match(waiter, '^(%x+)~')
  if client then return channel .. '~' .. client end
  return channel
end
"""

#: A waiter's place (KEYS of the caller: line, alive): it joins the line at its end, if not in it, on the
#: server's clock, and keeps its place for ``alive_ms`` more; both keys expire ``2 * alive_ms`` after the
#: last read of any waiter. Returns the server's time in ms. Prepended to the scripts that use it.
KEEP_PLACE = """
local function keep_place(line, alive, waiter, alive_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', line, 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), waiter)
  redis.call('HSET', alive, waiter, now + alive_ms)
  redis.call('PEXPIRE', line, 2 * alive_ms)
  redis.call('PEXPIRE', alive, 2 * alive_ms)
  return now
end
"""

#: The handover of a released lease to the head of its line (KEYS of the caller: lease, fence, line, alive),
#: where that waiter has offered to take it: its last read in line left ``<waiter> offer`` in the alive hash,
#: "<written> <px_ms> <lease_ms> <version> <owner>" (written: the server's time of that read, in ms). An
#: offer older than a third of its px_ms is not taken. Writes the lease as ACQUIRE would, in the offer's
#: owner and version, but with a PX of the offer's px_ms (a waiter that died in line loses the key that soon:
#: its first renewal sets the full lease), takes the waiter out of the line and tells it, on its turn channel
#: of ``channel`` (TURN_CHANNEL): its id, a space, "=", the version and, after a space, the new fencing
#: token. Returns true if it did. Prepended to the scripts that use it.
HAND_OVER = """
local function hand_over(lease, fence_key, line, alive, head, channel)
  local offer = redis.call('HGET', alive, head .. ' offer')
  if not offer then return false end
  local written, px, lease_ms, version, owner = string.match(offer, '^(%d+) (%d+) (%d+) (%S+) (.+)$')
  if not owner then return false end
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(written) > tonumber(px) / 3 then
    return false
  end
  local fence = redis.call('INCR', fence_key)
  redis.call('HSET', lease, 'owner', owner, 'version', version, 'lease_ms', lease_ms, 'protocol', '1', 'fence', fence)
  redis.call('PEXPIRE', lease, px)
  redis.call('ZREM', line, head)
  redis.call('HDEL', alive, head, head .. ' offer')
  redis.call('PUBLISH', turn_channel(channel, head), head .. ' =' .. version .. ' ' .. fence)
  return true
end
"""

#: Acquire. KEYS: lease, fence, line, alive. ARGV: owner, version, lease_ms, waiter ('' for none), and
#: for a semaphore's slot, the channel of its line. Creates the lease only if the key is absent (held
#: or merely not yet expired: untouched) and it is the caller's turn: nobody waits in line, or the
#: caller (``waiter``) is the head of the line, which it then leaves. A semaphore's line passes the turn
#: on to its next waiter, since another slot may be free too: its id and a space, with no slot named
#: (the waiter looks at every slot), on its turn channel of the line's channel (TURN_CHANNEL). Returns the
#: new fencing token, or 0.
ACQUIRE = NEXT_IN_LINE + TURN_CHANNEL + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local first = next_in_line(KEYS[3], KEYS[4])
if first and first ~= ARGV[4] then return 0 end
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('HDEL', KEYS[4], ARGV[4], ARGV[4] .. ' offer')
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'version', ARGV[2], 'lease_ms', ARGV[3],
           'protocol', '1', 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local next_head = ARGV[5] and next_in_line(KEYS[3], KEYS[4])
if next_head then redis.call('PUBLISH', turn_channel(ARGV[5], next_head), next_head .. ' ') end
return fence
"""

#: Takeover. KEYS: lease, fence. ARGV: expected owner, expected version, owner, version, lease_ms.
#: Replaces the whole lease (no waiting mark, a fresh PX) only if it holds exactly the expected
#: owner and version; returns the new fencing token, or 0.
TAKE_OVER = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] then return 0 end
local fence = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'version', ARGV[4], 'lease_ms', ARGV[5],
           'protocol', '1', 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return fence
"""

#: Renew. KEYS: lease. ARGV: owner, version, new version.
#: Sets the new version and resets PX to the stored lease_ms, only if the lease holds exactly
#: (owner, version) and its lease_ms is a plain positive integer; returns 1, or 0.
RENEW = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version', 'lease_ms')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] then return 0 end
if not seen[3] or not string.match(seen[3], '^[1-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?$') then
  return 0
end
redis.call('HSET', KEYS[1], 'version', ARGV[3])
redis.call('PEXPIRE', KEYS[1], seen[3])
return 1
"""

#: Mark waiting. KEYS: lease. ARGV: owner, version.
#: Sets the turn-taking hint once per hold, only on exactly (owner, version). The PX is left alone:
#: a contender's write must never keep a crashed holder's lease alive.
MARK_WAITING = """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'version', 'waiting')
if seen[1] ~= ARGV[1] or seen[2] ~= ARGV[2] or seen[3] then return 0 end
redis.call('HSET', KEYS[1], 'waiting', '1')
return 1
"""

#: Release. KEYS: lease, and line, alive (left out on a slot being migrated), and fence (a lock's key: where
#: the release may hand the lease over). ARGV: owner, channel, and where the line is another key's (a
#: semaphore's slot), that line's channel and the key released. Deletes the lease only if ``owner`` holds it
#: (whatever its version); then hands it over to the head of the line where it has offered to take it
#: (HAND_OVER), or publishes a wake-up: the id of the waiter whose turn it is, on its turn channel
#: (TURN_CHANNEL) of the line's channel (followed by a space and the key released, which the waiter then
#: tries first, where the line is a semaphore's), or '1' on the key's channel when
#: nobody waits in line (or the line is left out: each waiter's read then tells it whether the turn is its
#: own). Returns the store's answer itself: 0 (NOT_DELETED) if absent or held by another, else 3
#: (HANDED_OVER) if handed over, 2 (DELETED_WITH_WAITERS) if the deleted lease carried the waiting mark, or 1
#: (DELETED).
RELEASE = NEXT_IN_LINE + TURN_CHANNEL + HAND_OVER + """
local seen = redis.call('HMGET', KEYS[1], 'owner', 'waiting')
if seen[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local head = KEYS[2] and next_in_line(KEYS[2], KEYS[3])
if head and ARGV[3] then
  redis.call('PUBLISH', turn_channel(ARGV[3], head), head .. ' ' .. ARGV[4])
elseif head and KEYS[4] and hand_over(KEYS[1], KEYS[4], KEYS[2], KEYS[3], head, ARGV[2]) then
  return 3
elseif head then
  redis.call('PUBLISH', turn_channel(ARGV[2], head), head)
else
  redis.call('PUBLISH', ARGV[2], '1')
end
if seen[2] == '1' then return 2 end
return 1
"""

#: Finish an idempotent call. KEYS: lease, record, fence, line, alive. ARGV: owner, state, fingerprint,
#: result, expires_at_ms, px (0: no expiry), channel. Only while ``owner`` holds the lease: replaces the
#: record, deletes the lease, the key's fencing counter and its line, and publishes the release to every
#: waiter ('1'): each of them now finds the record, so none needs a turn; returns 1, or 0.
#: The counter goes too because idempotency keys are mostly used once and nothing reads an idempotent
#: call's token: kept, every key ever used would leave a counter that never expires.
FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'state', ARGV[2], 'fingerprint', ARGV[3], 'result', ARGV[4],
           'expires_at_ms', ARGV[5], 'owner', ARGV[1])
if ARGV[6] ~= '0' then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
redis.call('PUBLISH', ARGV[7], '1')
return 1
"""

#: Observe. KEYS: lease. The lease's fields (an empty list when absent) and its PTTL in ms (-2 when
#: absent): a waiter on a key whose holder crashed learns when the lease will expire, since nobody
#: will publish a release for it.
OBSERVE = """
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

#: Observe, in line. KEYS: lease, line, alive. ARGV: waiter, alive_ms, and for a waiter that offers to
#: take the lease over on its release (a lock's, not a semaphore's): owner, version, lease_ms, px_ms. As
#: OBSERVE, and the waiter joins the key's line (at its end, if not in it) and keeps its place for
#: ``alive_ms`` more, leaving its offer (see HAND_OVER); unless the lease was handed over to it already (in
#: that owner: the row tells it so). A third element is 1 if the key is free and the turn is the waiter's,
#: else 0.
OBSERVE_IN_LINE = NEXT_IN_LINE + KEEP_PLACE + """
if not ARGV[3] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[3] then
  local now = keep_place(KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2]))
  if ARGV[3] then
    redis.call('HSET', KEYS[3], ARGV[1] .. ' offer',
               now .. ' ' .. ARGV[6] .. ' ' .. ARGV[5] .. ' ' .. ARGV[4] .. ' ' .. ARGV[3])
  end
end
local fields = redis.call('HGETALL', KEYS[1])
local turn = 0
if #fields == 0 and next_in_line(KEYS[2], KEYS[3]) == ARGV[1] then turn = 1 end
return {fields, redis.call('PTTL', KEYS[1]), turn}
"""

#: Observe every slot of a semaphore, in line. KEYS: line, alive, then each slot's lease. ARGV: waiter,
#: alive_ms. As OBSERVE_IN_LINE for every lease in one step, the place kept once: the first element is
#: the index (from 0) of the first free lease if the turn is the waiter's, else -1; then each lease's
#: fields and PTTL.
OBSERVE_ALL_IN_LINE = NEXT_IN_LINE + KEEP_PLACE + """
keep_place(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]))
local out = {-1}
for i = 3, #KEYS do
  local fields = redis.call('HGETALL', KEYS[i])
  if #fields == 0 and out[1] < 0 then out[1] = i - 3 end
  out[#out + 1] = fields
  out[#out + 1] = redis.call('PTTL', KEYS[i])
end
if out[1] >= 0 and next_in_line(KEYS[1], KEYS[2]) ~= ARGV[1] then out[1] = -1 end
return out
"""

#: Leave the line. KEYS: lease, line, alive. ARGV: waiter, channel, and the owner it offered the lease to be
#: handed over in, if it did. The waiter gives up its place and its offer; a lease handed over to it meanwhile
#: (in that owner) is deleted. If it had the turn, or was handed the lease, and the key is free, the next
#: waiter in line is woken on its turn channel (TURN_CHANNEL; with nobody in line after a lease handed over,
#: every waiter: '1' on ``channel``). Returns 1.
LEAVE_LINE = NEXT_IN_LINE + TURN_CHANNEL + """
local first = next_in_line(KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1], ARGV[1] .. ' offer')
local handed = ARGV[3] and redis.call('HGET', KEYS[1], 'owner') == ARGV[3]
if handed then redis.call('DEL', KEYS[1]) end
if (first == ARGV[1] or handed) and redis.call('EXISTS', KEYS[1]) == 0 then
  local head = next_in_line(KEYS[2], KEYS[3])
  if head then
    redis.call('PUBLISH', turn_channel(ARGV[2], head), head)
  elseif handed then
    redis.call('PUBLISH', ARGV[2], '1')
  end
end
return 1
"""

SCRIPTS = {"ACQUIRE": ACQUIRE, "TAKE_OVER": TAKE_OVER, "RENEW": RENEW, "MARK_WAITING": MARK_WAITING,
           "RELEASE": RELEASE, "FINISH": FINISH, "OBSERVE": OBSERVE, "OBSERVE_IN_LINE": OBSERVE_IN_LINE,
           "LEAVE_LINE": LEAVE_LINE, "OBSERVE_ALL_IN_LINE": OBSERVE_ALL_IN_LINE}


class Script:
    """A script and its SHA1, the name EVALSHA runs it by."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source.encode()
        self.sha = _sha1(self.source).hexdigest().encode()


class ScriptSet:
    """The ten scripts as one store sends them. ``publish`` replaces the call that ACQUIRE, RELEASE, FINISH
    and LEAVE_LINE wake waiters with (``redis.call('PUBLISH',``); the cluster store's publishes on a shard
    channel of the script's own slot. Nothing else differs."""

    __slots__ = ("acquire", "take_over", "renew", "mark_waiting", "release", "finish", "observe", "observe_in_line",
                 "leave_line", "observe_all_in_line", "all")

    def __init__(self, publish: str = "redis.call('PUBLISH',") -> None:
        sources = {name: source.replace("redis.call('PUBLISH',", publish) for name, source in SCRIPTS.items()}
        self.all = tuple(Script(name, source) for name, source in sources.items())
        (self.acquire, self.take_over, self.renew, self.mark_waiting, self.release, self.finish,
         self.observe, self.observe_in_line, self.leave_line, self.observe_all_in_line) = self.all


NODE_SCRIPTS = ScriptSet()
#: On a cluster: SPUBLISH (sharded pub/sub), under pcall, so that a server without it (before Redis 7)
#: still releases, and its waiters poll. The wake-up is the last command, so nothing is left half done.
CLUSTER_SCRIPTS = ScriptSet("redis.pcall('SPUBLISH',")
#: How DEBUG lines name a script sent by EVALSHA (of either set).
SCRIPT_NAMES = {script.sha: script.name for script in NODE_SCRIPTS.all + CLUSTER_SCRIPTS.all}


def lease_key(table: str, key: str) -> bytes:
    """The Redis key of the lease on ``key`` in lock table ``table``."""
    return f"{PREFIX}:{table}:lease:".encode() + key.encode("utf-8")


def fence_key(table: str, key: str) -> bytes:
    """The Redis key of the fencing counter of ``key`` in lock table ``table`` (it never expires; an
    idempotent call's completion deletes it)."""
    return f"{PREFIX}:{table}:fence:".encode() + key.encode("utf-8")


def line_key(table: str, key: str) -> bytes:
    """The Redis key of the line of waiters for ``key`` in lock table ``table`` (a sorted set)."""
    return f"{PREFIX}:{table}:line:".encode() + key.encode("utf-8")


def alive_key(table: str, key: str) -> bytes:
    """The Redis key of the liveness deadlines of ``key``'s waiters in lock table ``table`` (a hash)."""
    return f"{PREFIX}:{table}:alive:".encode() + key.encode("utf-8")


def record_key(table: str, key: str) -> bytes:
    """The Redis key of the idempotency record of ``key`` in record table ``table``."""
    return f"{PREFIX}:{table}:record:".encode() + key.encode("utf-8")


def release_channel(table: str, key: str) -> bytes:
    """The pub/sub channel that releases of ``key`` in lock table ``table`` are published on."""
    return f"{PREFIX}:{table}:released:".encode() + key.encode("utf-8")


def turn_channel(channel: bytes, client_token: str) -> bytes:
    """The channel of a key (``channel``, its release channel on either layout) where the scripts give the
    waiters of the client with ``client_token`` their turns (TURN_CHANNEL; in the same cluster slot)."""
    return channel + b"~" + client_token.encode()


class NodeLayout:
    """Where a single-node store keeps a key's lease, fencing counter, idempotency record and release
    channel: the functions above. The cluster store has its own (``cluster.ClusterLayout``)."""

    lease = staticmethod(lease_key)
    fence = staticmethod(fence_key)
    line = staticmethod(line_key)
    alive = staticmethod(alive_key)
    record = staticmethod(record_key)
    channel = staticmethod(release_channel)

