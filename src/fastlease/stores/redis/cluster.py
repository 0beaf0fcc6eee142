"""Redis Cluster store: the Redis store's scripts and rows on a sharded Redis, each request sent to the
node that serves its key's slot.

**Layout.** A script may only touch keys of one slot, so every key of lock key ``K`` carries the same
hash tag, ``{E}``, where ``E`` is ``K`` with ``%`` written ``%25`` and ``}`` written ``%7D`` (a ``}``
would end the tag early, and keys that share a prefix up to it would all land in one slot). For lock
table ``T``:

* ``fastlease:{E}:T:lease``, the lease hash, as on one server;
* ``fastlease:{E}:T:fence``, the fencing counter;
* ``fastlease:{E}:T:line`` and ``fastlease:{E}:T:alive``, the key's line of waiters, as on one server;
* ``fastlease:{E}:T:record``, the idempotency record (``T`` is then the record table): the tag holds
  only the key, not the table, so that an idempotent call's lease and record share a slot and one
  script completes it;
* ``fastlease:{E}:T:released``, the shard channel (SPUBLISH) that release wakes waiters on.

The slot of ``K`` is CRC16(``E``) mod 16384. This layout is the cluster's only: single-node keys stay
as they were (``fastlease.stores.redis.store``), and the single-node store refuses a server in cluster mode,
so two clients can never hold one key under two names.

**Routing.** The store keeps the cluster's slot map (``CLUSTER SLOTS``, fetched on the first request
and again after a node fails) and one connection per node in each thread. A ``MOVED`` reply updates
the map and sends the request to the new node; ``ASK`` (a slot being migrated) sends it once to the
importing node, after ``ASKING``. Both mean the command did not run, so following them is safe; at most
:data:`MAX_REDIRECTIONS` are followed within the request's timeout. ``NOSCRIPT`` loads the script on the
node that said it (an importing node may never have run it). Every other failure is the single
node's: an error that may have run is ``maybe_committed`` and reconciled by the engine, and redis-py's
own retries are off.
"""

from __future__ import annotations

import binascii
import logging
import re
import threading
import time
from typing import Any, Callable, Optional, Sequence, cast

from ...exceptions import StoreError, StoreRequestRejected
from ..base import check_table
from .replies import as_text
from .scripts import CLUSTER_SCRIPTS
from .store import ConnectionSettings, RedisStore, renewal_transport
from .wire import pack_command as _pack

_log = logging.getLogger("fastlease.stores.redis")

__all__ = ["RedisClusterStore", "ClusterLayout", "key_slot", "escape_key", "MAX_REDIRECTIONS"]

SLOTS = 16384
#: MOVED/ASK replies followed in one request before it fails as transient (a resharding in progress
#: moves a slot once; more than this means the map and the cluster disagree).
MAX_REDIRECTIONS = 5

Address = tuple[str, int]

_CLUSTER_SLOTS = _pack((b"CLUSTER", b"SLOTS"))
_ASKING = _pack((b"ASKING",))
_ESCAPED = re.compile(rb"%(25|7D)")


def escape_key(key: str) -> bytes:
    """``key`` as it appears in the hash tag: UTF-8, ``%`` as ``%25`` and ``}`` as ``%7D``."""
    return key.encode("utf-8").replace(b"%", b"%25").replace(b"}", b"%7D")


def unescape_key(escaped: bytes) -> bytes:
    """A lock key as it was before its hash tag escaped ``}`` and ``%`` (for listing keys)."""
    return _ESCAPED.sub(lambda match: b"%" if match.group(1) == b"25" else b"}", escaped)


def key_slot(key: str) -> int:
    """The cluster slot of every Redis key of lock key ``key`` (CRC16-XMODEM of its tag, mod 16384)."""
    return tag_slot(escape_key(key))


def tag_slot(tag: bytes) -> int:
    """The slot of a hash tag's contents (an escaped key, as in every name of ``ClusterLayout``)."""
    return binascii.crc_hqx(tag, 0) % SLOTS


def name_slot(name: bytes) -> int:
    """The slot of a name of ``ClusterLayout`` (a key or a shard channel): that of its tag."""
    start = name.index(b"{") + 1
    return tag_slot(name[start:name.index(b"}", start)])


def _cluster_name(table: str, key: str, kind: str) -> bytes:
    return b"fastlease:{" + escape_key(key) + f"}}:{table}:{kind}".encode()


class ClusterLayout:
    """The cluster's key names (module docstring): one hash tag, the whole key, for all of them."""

    @staticmethod
    def lease(table: str, key: str) -> bytes:
        """The cluster key of ``key``'s lease hash in table ``table``."""
        return _cluster_name(table, key, "lease")

    @staticmethod
    def fence(table: str, key: str) -> bytes:
        """The cluster key of ``key``'s fencing counter in table ``table``."""
        return _cluster_name(table, key, "fence")

    @staticmethod
    def line(table: str, key: str) -> bytes:
        """The cluster key of ``key``'s line of waiters in table ``table``."""
        return _cluster_name(table, key, "line")

    @staticmethod
    def alive(table: str, key: str) -> bytes:
        """The cluster key of the liveness deadlines of ``key``'s waiters in table ``table``."""
        return _cluster_name(table, key, "alive")

    @staticmethod
    def record(table: str, key: str) -> bytes:
        """The cluster key of ``key``'s idempotency record in table ``table``."""
        return _cluster_name(table, key, "record")

    @staticmethod
    def channel(table: str, key: str) -> bytes:
        """The cluster key of ``key``'s release channel in table ``table``."""
        return _cluster_name(table, key, "released")


class _Redirected(StoreError):
    """A MOVED or ASK reply: the command did not run; ``address`` serves the slot (MOVED) or is
    importing it (ASK). Caught by the routing loop; if it ever escaped, it is a transient error."""

    def __init__(self, message: str, key: str, ask: bool, slot: int, address: Address) -> None:
        super().__init__(message, key=key)
        self.ask, self.slot, self.address = ask, slot, address


class _NoScript(Exception):
    """NOSCRIPT from the node at ``address``: the script did not run there (``run_script`` loads it on
    that node and sends it again)."""

    def __init__(self, address: Address) -> None:
        super().__init__(f"NOSCRIPT from {address[0]}:{address[1]}")
        self.address = address


def redirection(redis: Any, error: Exception) -> Optional[tuple[bool, int, str, int]]:
    """(ask, slot, host, port) of a MOVED or ASK reply, else None. redis-py raises them as classes of their
    own, with the parts parsed; our own connection (``wire``) keeps the reply's text, "MOVED 3999 host:port"."""
    if isinstance(error, (redis.exceptions.MovedError, redis.exceptions.AskError)):
        return (not isinstance(error, redis.exceptions.MovedError), int(error.slot_id), str(error.host or ""),
                int(error.port))
    words = str(error).split()
    if len(words) != 3 or words[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = words[2].rpartition(":")
    try:
        return words[0] == "ASK", int(words[1]), host, int(port)
    except ValueError:
        return None


class RedisClusterStore(RedisStore):
    """The LockStore adapter for a Redis Cluster: the Redis store's requests, each routed to its slot's node."""

    kind = "redis-cluster"  # in stores.registry
    layout: Any = ClusterLayout
    scripts = CLUSTER_SCRIPTS
    #: A semaphore's slots' keys hash to other slots than its key's line (the layout tags each by its own
    #: key, and moving them would split a slot's name between versions), so its waiters are woken by
    #: every release, as without a line.
    shared_lines = False
    name_slot = staticmethod(name_slot)  # for the feed, which routes its shard channels by slot

    def __init__(self, startup_nodes: Sequence[Address], connection_class: Any, connection_kwargs: dict[str, Any],
                 address_remap: Optional[Callable[[Address], Address]] = None, library: Any = None) -> None:
        """``startup_nodes``: (host, port) of nodes to ask for the slot map; ``connection_kwargs``: the
        connection settings of every node (credentials, TLS, timeouts), without host and port;
        ``address_remap``: redis-py's hook for nodes that announce addresses the client cannot use;
        ``library``: ``wire.library`` with ``wire``'s connection class (the renewal process), else redis-py."""
        if not startup_nodes:
            raise ValueError("RedisClusterStore needs at least one startup node (host, port)")
        pool = ConnectionSettings(connection_class, {name: value for name, value in connection_kwargs.items()
                                                     if name not in ("host", "port")}, library)
        self.startup_nodes = [(str(host), int(port)) for host, port in startup_nodes]
        self.address_remap = address_remap
        self._slots: Optional[list[Optional[Address]]] = None  # None: fetch before the next request
        self._last_nodes: list[Address] = []  # the primaries of the last map: asked first for the next
        self._suspect: Optional[Address] = None  # the node whose request failed last: asked last for a map
        self._map_lock = threading.Lock()
        super().__init__(pool)
        self.no_script = _NoScript

    def new_release_feed(self) -> Any:
        """The sharded pub/sub feed (``cluster_feed``)."""
        from .cluster_feed import RedisClusterReleaseFeed

        return RedisClusterReleaseFeed(self)

    def describe(self) -> str:
        """The startup nodes, for messages and the CLI (never credentials)."""
        return "cluster " + ",".join(f"{host}:{port}" for host, port in self.startup_nodes)

    # ---- transport ---------------------------------------------------------------------------------
    def new_connection(self, resp2: bool = False, address: Optional[Address] = None) -> Any:
        """A connection to the node at ``address`` (default: the first startup node) with our settings."""
        host, port = address or self.startup_nodes[0]
        return self.connection_with({**self.connection_kwargs, "host": host, "port": port}, resp2)

    def node_connection(self, address: Address) -> Any:
        """This thread's connection to the node at ``address``."""
        connections = getattr(self._local, "nodes", None)
        if connections is None:
            connections = self._local.nodes = {}
        connection = connections.get(address)
        if connection is None:
            if self._closed:
                raise StoreError("the Redis client is closed")
            connection = connections[address] = self.new_connection(address=address)
        return connection

    def _call(self, key: str, timeout_s: float, command: tuple[Any, ...]) -> Any:
        deadline = time.monotonic() + timeout_s
        slot = key_slot(key)
        packed = _pack(command)
        ask: Optional[Address] = None
        for _ in range(MAX_REDIRECTIONS + 1):
            address = ask or self.node_for(slot, key, deadline)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return self.exchange(self.node_connection(address), key, remaining,
                                     (_ASKING, packed) if ask else (packed,))
            except _Redirected as redirect:
                ask = redirect.address if redirect.ask else None
                if not redirect.ask:
                    self._moved(redirect.slot, redirect.address)
            except self._redis.exceptions.NoScriptError as error:
                raise _NoScript(address) from error  # not run: run_script loads the script on this node
            except StoreError:
                # The node failed, timed out, or says the cluster is down: its slots may have moved.
                self._suspect = address
                self.forget_slot_map()
                raise
        raise StoreError(f"Redis Cluster request on {key!r} (slot {slot}) did not run: redirected more than "
                         f"{MAX_REDIRECTIONS} times, or out of its {timeout_s:.3g}s while redirected", key=key)

    def load_script(self, script: Any, key: str, timeout_s: float, missing: Exception) -> Any:
        """SCRIPT LOAD on the node that answered NOSCRIPT. It is not always the slot's node in the map: a
        node importing the slot, which an ASK sent the script to, may never have run it, and loading it
        on the slot's node would leave every EVALSHA through the ASK without it until the slot moves."""
        address = cast(_NoScript, missing).address
        reply = self.exchange(self.node_connection(address), key, timeout_s,
                              (_pack((b"SCRIPT", b"LOAD", script.source)),))
        _log.debug("SCRIPT LOAD %s %r on %s:%d -> ok", script.name, key, *address)
        return reply

    def _classify_reply(self, error: Exception, key: str) -> Exception:
        redirect = redirection(self._redis, error)
        if redirect is not None:
            ask, slot, host, port = redirect
            host = host or self.startup_nodes[0][0]  # an empty host: the node we asked
            address = self._remap((host, port))
            return _Redirected(f"{'ASK' if ask else 'MOVED'} {slot} {host}:{port}", key, ask, slot, address)
        return super()._classify_reply(error, key)

    # ---- the slot map ------------------------------------------------------------------------------
    def node_for(self, slot: int, key: str, deadline: float) -> Address:
        """The node that serves ``slot``, from the map (fetched first if it is missing)."""
        slots = self._slots
        if slots is None:
            slots = self._refresh(key, deadline)
        address = slots[slot]
        if address is None:
            self._slots = None
            raise StoreError(f"no node of the Redis Cluster ({self.describe()}) serves slot {slot} of {key!r} now "
                             "(a node is down, or the slot is unassigned)", key=key)
        return address

    def nodes(self, deadline: Optional[float] = None) -> list[Address]:
        """The primaries that serve slots, as the map has them (fetched if missing)."""
        slots = self._slots
        if slots is None:
            slots = self._refresh("", deadline if deadline is not None else time.monotonic() + 5.0)
        return sorted({address for address in slots if address is not None})

    def forget_slot_map(self) -> None:
        """Fetch the slot map again before the next request (a node failed, or a slot moved)."""
        self._slots = None

    def _moved(self, slot: int, address: Address) -> None:
        slots = self._slots
        if slots is not None:
            slots[slot] = address  # one slot moved (a resharding moves them one by one)

    def _remap(self, address: Address) -> Address:
        return self.address_remap(address) if self.address_remap is not None else address

    def _refresh(self, key: str, deadline: float) -> list[Optional[Address]]:
        """Fetch the slot map from the first node that answers: the nodes of the last map, then the
        startup nodes. One thread fetches; the others wait for it, within their own deadline."""
        if not self._map_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise StoreError(f"timed out waiting for the Redis Cluster slot map ({self.describe()})", key=key)
        try:
            if self._slots is not None:  # another thread fetched it while we waited
                return self._slots
            candidates = list(dict.fromkeys([*self._last_nodes, *self.startup_nodes]))
            if self._suspect in candidates:  # the node that just failed is asked last
                candidates.remove(self._suspect)
                candidates.append(self._suspect)
            failures = []
            for index, address in enumerate(candidates):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # An unreachable host can take a whole connect timeout: leave time for the others.
                share = remaining / (len(candidates) - index)
                try:
                    reply = self.exchange(self.node_connection(address), key, share, (_CLUSTER_SLOTS,))
                except StoreError as error:
                    failures.append(f"{address[0]}:{address[1]}: {error}")
                    continue
                except StoreRequestRejected as error:
                    raise self._not_a_cluster(address, error, key) from error
                slots = self._parse_slots(reply, address, key)
                self._last_nodes = sorted({node for node in slots if node is not None})
                self._slots = slots
                return slots
            raise StoreError(f"no node of the Redis Cluster answered CLUSTER SLOTS ({self.describe()}): "
                             + ("; ".join(failures) or "out of time"), key=key)
        finally:
            self._map_lock.release()

    def _not_a_cluster(self, address: Address, error: StoreRequestRejected, key: str) -> StoreRequestRejected:
        """A node refused CLUSTER SLOTS: name it, and say what to connect with when it is a single
        server (``ERR This instance has cluster support disabled``). Otherwise the store's own message
        stands (it says, for instance, that the credentials were refused), with the node named."""
        reply = str(error.__cause__ or error)
        where = f"{address[0]}:{address[1]}"
        if "cluster support disabled" in reply:
            return StoreRequestRejected(
                f"the Redis server at {where} is not a Redis Cluster node ({reply}): give it the URL "
                f"redis://{where}/0, not a redis+cluster:// URL", key=key or None)
        return StoreRequestRejected(f"Redis Cluster node {where} refused CLUSTER SLOTS: {error}", key=key or None)

    def _parse_slots(self, reply: Any, asked: Address, key: str) -> list[Optional[Address]]:
        slots: list[Optional[Address]] = [None] * SLOTS
        try:
            for entry in reply:
                start, end, primary = int(entry[0]), int(entry[1]), entry[2]
                host = as_text(primary[0]) if primary[0] is not None else ""
                # An empty or unknown endpoint means: the address we asked, with this port.
                address = self._remap((host if host not in ("", "?") else asked[0], int(primary[1])))
                slots[start:end + 1] = [address] * (end - start + 1)
        except (TypeError, ValueError, IndexError) as error:
            raise StoreError(f"Redis Cluster node {asked[0]}:{asked[1]} gave a CLUSTER SLOTS reply that is not "
                             f"a slot map: {reply!r:.200}", key=key) from error
        return slots

    # ---- the renewal process ----------------------------------------------------------------------
    def renewal_config(self) -> Any:
        """As the single-node store's, with the nodes to start from."""
        if self.address_remap is not None:
            return "a Redis Cluster address_remap is a function, which cannot be given to another process"
        portable = self.portable_settings()
        if isinstance(portable, str):
            return portable
        slots = self._slots
        nodes = sorted({a for a in slots if a is not None}) if slots is not None else []
        return (self.kind, *portable, list(dict.fromkeys([*nodes, *self.startup_nodes])))

    @classmethod
    def from_renewal_config(cls, config: Any, credentials: Any = None) -> RedisClusterStore:
        """A cluster store with the settings and nodes ``renewal_config()`` gave (in the renewal process):
        on our own connections (``wire``) when they honour every setting, as for one server, which spares
        the renewal process importing redis-py at its first lease (a fifth of a second idle, longer under
        load, out of the first lease's validity), else on redis-py's."""
        connection_class, library = renewal_transport(config[1], config[2])
        return cls(config[3], connection_class, config[2], library=library)

    def inspect(self, table: str, key: Optional[str]) -> list[dict[str, Any]]:
        """Held leases of ``table`` (or only ``key``'s): SCAN on every primary, then one HGETALL each."""
        check_table(table)  # the engine's rule: no ':' or glob character can reach the SCAN pattern
        if key is not None:
            return super().inspect(table, key)
        timeout_s = 5.0
        suffix = f"}}:{table}:lease".encode()
        names = set()
        for address in self.nodes():
            connection = self.node_connection(address)
            cursor: Any = b"0"
            while True:  # SCAN ends when the cursor comes back to 0
                cursor, found = self.exchange(connection, table, timeout_s, (
                    _pack((b"SCAN", cursor, b"MATCH", b"fastlease:{*" + suffix, b"COUNT", 1000)),))
                for name in found:
                    tag, _, rest = name[len(b"fastlease:{"):].partition(b"}")
                    if b"}" + rest == suffix:
                        names.add(unescape_key(tag).decode("utf-8", "backslashreplace"))
                if as_text(cursor) in ("0", 0):
                    break
        rows = []
        for name in sorted(names):
            rows.extend(super().inspect(table, name))
        return rows

