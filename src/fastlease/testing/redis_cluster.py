"""A throwaway Redis Cluster for tests, benchmarks and chaos runs: three (or more) primaries without
replicas on free 127.0.0.1 ports, no persistence, joined by ``redis-cli --cluster create``, each node
stopped by its PID.

From a shell, ``python -m fastlease.testing.redis_cluster`` prints ``READY redis+cluster://...`` and serves
until SIGTERM or Ctrl-C.

``RedisClusterServer().start()`` returns ``redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>``
once every node says ``cluster_state:ok`` and every node reports the same owner for each of the 16384
slots. Each node is a ``redis-server`` under the launcher of :mod:`fastlease.testing._process`, so it
also stops when this process dies without stopping it. It needs Redis 7 or later (``--cluster-port``
puts each node's cluster bus on a free port of its own, instead of the client port + 10000, which may be
taken or above 65535), ``redis-cli`` (``$REDIS_CLI``, else beside ``redis-server``, else on PATH;
Debian's ``redis-tools`` package, which ``redis-server`` pulls in) and redis-py.

What a test can do to the cluster, each step bounded in time:

- :meth:`~RedisClusterServer.node_for_slot`: the node that owns a slot now;
- :meth:`~RedisClusterServer.migrate_slot`: a real slot migration, step by step as
  ``redis-cli --cluster reshard`` makes one (``CLUSTER SETSLOT IMPORTING`` on the target, ``MIGRATING``
  on the source, ``MIGRATE`` of each key that ``CLUSTER GETKEYSINSLOT`` lists, then ``SETSLOT NODE`` on
  every node), and the same steps one by one, so that a test can stop half-way:
  :meth:`~RedisClusterServer.begin_migration`, :meth:`~RedisClusterServer.move_keys`,
  :meth:`~RedisClusterServer.finish_migration`;
- :meth:`~RedisClusterServer.kill_node` (SIGKILL), :meth:`~RedisClusterServer.pause_node` and
  :meth:`~RedisClusterServer.resume_node` (SIGSTOP, SIGCONT), each by the node's PID;
- :meth:`~RedisClusterServer.flushall`: every primary emptied.

``--cluster-require-full-coverage no``: a node that is down (killed, or paused for longer than the node
timeout) makes only its own slots unavailable, and the other nodes go on serving theirs, as on
ElastiCache's default cluster-mode parameter group. With ``yes`` the whole cluster would refuse every
command once one node is marked failed, and no test could watch the leases of the other nodes survive.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

# CLUSTER_SLOTS and Node are public here (see __all__); they are defined with the slot readers.
from ._cluster_slots import CLUSTER_SLOTS, Node, check_slot, disagreement, slot_ranges
from ._process import GUARD_GRACE_S, HOST, ServerNotReady, ServerProcess, free_port, serve_until_stopped
from .redis_server import READY_TEXT, redis_server_path

if TYPE_CHECKING:
    import redis

__all__ = ["CLUSTER_SLOTS", "Node", "RedisClusterServer", "RedisClusterUnavailable", "redis_cli_path"]

#: Fewest primaries ``redis-cli --cluster create`` accepts.
MIN_NODES = 3
#: How long a node may be unreachable before the others mark it failed (Redis's default is 15 s). Short,
#: so that a test that kills a node sees its slots fail within seconds; not so short that a busy 2-core
#: machine makes a node miss it and a healthy node is marked failed.
NODE_TIMEOUT_MS = 2000
#: See the module docstring: a dead node takes down its own slots only.
REQUIRE_FULL_COVERAGE = "no"
#: Socket timeout of the admin connections (one per node): the longest any one admin command may take.
ADMIN_TIMEOUT_S = 5.0
#: Keys per ``CLUSTER GETKEYSINSLOT`` and ``MIGRATE`` round (redis-cli's ``--cluster-pipeline`` default is 10).
MIGRATE_BATCH = 100
#: ``MIGRATE``'s own timeout (ms) for the transfer to the target node.
MIGRATE_TIMEOUT_MS = 5000
#: How long a migration step or a wait for the nodes to agree may take, unless the caller says otherwise.
STEP_TIMEOUT_S = 10.0
#: How often the nodes are asked whether they agree: nothing signals that a cluster has converged.
POLL_S = 0.02
#: Characters of a tool's output kept in an error report.
OUTPUT_TAIL_CHARS = 3000
#: redis-cli colours its ``--cluster`` output even into a pipe.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class RedisClusterUnavailable(RuntimeError):
    """A node (``redis-server``) or ``redis-cli`` is missing, or the cluster could not be started and joined."""


def redis_cli_path() -> Optional[str]:
    """The ``redis-cli`` executable: ``$REDIS_CLI`` when set (and only it), else the one beside
    ``redis-server`` (see :func:`~fastlease.testing.redis_server.redis_server_path`), else on PATH, /usr/bin
    and /usr/sbin; None if there is none."""
    configured = os.environ.get("REDIS_CLI")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    server = redis_server_path()
    if server is not None:
        # Debian's /usr/bin/redis-server is a symlink to redis-check-rdb: both directories are candidates.
        for directory in dict.fromkeys((os.path.dirname(server), os.path.dirname(os.path.realpath(server)))):
            beside = os.path.join(directory, "redis-cli")
            if os.access(beside, os.X_OK):
                return beside
    return shutil.which("redis-cli") or shutil.which("redis-cli", path="/usr/bin:/usr/sbin:/usr/local/bin")


def _load_redis() -> Any:
    """The redis-py package, or ImportError naming the extra to install."""
    try:
        import redis
        import redis.backoff
        import redis.retry
    except ImportError as error:
        raise ImportError("RedisClusterServer needs redis-py: pip install 'fastlease[redis]'") from error
    return redis


def _is_ready_line(line: str) -> bool:
    return READY_TEXT in line.lower()


class RedisClusterServer:
    """A throwaway Redis Cluster of primaries on 127.0.0.1 (see the module docstring).

    Nodes are numbered from 0 in the order of :attr:`nodes`; every method that takes a node takes its
    (host, port) or that number. Not thread-safe: one thread drives it (its node processes, of course,
    serve any number of clients)."""

    def __init__(self) -> None:
        self._processes: list[ServerProcess] = []
        self._nodes: list[Node] = []  # kept after stop(), so that callers can check the nodes are gone
        self._directories: list[str] = []  # one a node (its nodes.conf); kept after stop(), which removes them
        self._server_pids: list[int] = []  # the redis-server processes (the guards' children)
        self._node_ids: list[bytes] = []
        self._admin: list[Any] = []  # one redis.Redis per node, for the admin commands
        self._down: set[int] = set()  # nodes killed by kill_node()
        self._paused: set[int] = set()  # nodes stopped by pause_node() and not resumed yet
        self._migrations: dict[int, tuple[int, int]] = {}  # slot -> (source, target) between begin and finish

    # --- what it is ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,...``; RuntimeError unless running."""
        self._require_running()
        return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in self._nodes)

    @property
    def nodes(self) -> list[Node]:
        """(host, port) of each node, in node order; RuntimeError if it was never started. Still the last
        start's after stop()."""
        if not self._directories:
            raise RuntimeError("RedisClusterServer was never started")
        return list(self._nodes)

    @property
    def pids(self) -> list[int]:
        """The PID that stop() signals for each node (its guard, which stops the node's ``redis-server``);
        RuntimeError if it was never started. Still the last start's after stop(), so callers can check
        they are gone."""
        if not self._directories:
            raise RuntimeError("RedisClusterServer was never started")
        return [pid for pid in (process.pid for process in self._processes) if pid is not None]

    @property
    def node_pids(self) -> list[int]:
        """The PID of each node's ``redis-server`` (the guard's child): what :meth:`kill_node` and
        :meth:`pause_node` signal. RuntimeError if it was never started; still the last start's after stop()."""
        if not self._directories:
            raise RuntimeError("RedisClusterServer was never started")
        return list(self._server_pids)

    @property
    def directories(self) -> list[str]:
        """Each node's temporary directory (its ``--cluster-config-file`` and working directory); removed
        by stop(). RuntimeError if it was never started."""
        if not self._directories:
            raise RuntimeError("RedisClusterServer was never started")
        return list(self._directories)

    def running(self) -> bool:
        """Whether the cluster was started and not stopped (some nodes may have been killed since)."""
        return bool(self._admin)

    # --- start and stop -----------------------------------------------------------------------------------

    def start(self, nodes: int = MIN_NODES, timeout_s: float = 30.0, attempts: int = 3) -> str:
        """Start ``nodes`` primaries (3 or more) on free ports, join them with ``redis-cli --cluster create
        ... --cluster-replicas 0 --cluster-yes``, and wait until every node says ``cluster_state:ok`` and
        all agree on the owner of every slot; returns :attr:`url`. A second call while running returns the
        same URL. RedisClusterUnavailable, with the node's or redis-cli's output, if a node cannot start or
        the nodes cannot be joined within ``timeout_s`` (everything started is stopped first). A node that
        could not bind its ports is retried on others, ``attempts`` times in all. Takes about 2 s: the
        ``redis-cli --cluster create`` waits 1 s before and 1 s while the nodes join, and a primary says
        ``cluster_state:ok`` 2 s after it started at the earliest (Redis's ``CLUSTER_WRITABLE_DELAY``)."""
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < MIN_NODES:
            raise ValueError(f"nodes must be an int of at least {MIN_NODES} (redis-cli --cluster create needs "
                             f"{MIN_NODES} primaries), not {nodes!r}")
        if self.running():
            return self.url
        self.stop()  # what a previous start left: processes, directories, connections
        deadline = time.monotonic() + timeout_s
        executable = redis_server_path()
        if executable is None:
            raise RedisClusterUnavailable(
                "redis-server is not installed (apt-get install -y redis-server, or set REDIS_SERVER)"
            )
        cli = redis_cli_path()
        if cli is None:
            raise RedisClusterUnavailable(
                "redis-cli is not installed (apt-get install -y redis-tools, or set REDIS_CLI)"
            )
        redis = _load_redis()
        self._nodes, self._directories, self._server_pids, self._node_ids = [], [], [], []
        self._processes = []
        try:
            for index in range(nodes):
                self._start_node(index, executable, deadline, attempts)
            # No retry: redis-py's default resends a command that timed out, with backoff, which would
            # stretch ADMIN_TIMEOUT_S several times over (and resend a MIGRATE that may have run).
            self._admin = [redis.Redis(host=host, port=port, socket_timeout=ADMIN_TIMEOUT_S,
                                       socket_connect_timeout=ADMIN_TIMEOUT_S,
                                       retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
                           for host, port in self._nodes]
            self._create(cli, deadline)
            self._wait_until_agreed(deadline, what="to join")
            for client in self._admin:
                self._node_ids.append(bytes(client.execute_command("CLUSTER", "MYID")))
                self._server_pids.append(int(client.info("server")["process_id"]))
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start_node(self, index: int, executable: str, deadline: float, attempts: int) -> None:
        directory = tempfile.mkdtemp(prefix=f"fastlease-redis-cluster-{index}-")
        self._directories.append(directory)
        process = ServerProcess(f"redis-server (cluster node {index})")
        self._processes.append(process)

        def command(port: int) -> list[str]:
            # The bus port is free now; if another process takes it first, the node exits with "Address
            # already in use" and the launcher retries with another pair.
            return [executable, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--protected-mode", "yes", "--logfile", "", "--dir", directory,
                    "--cluster-enabled", "yes", "--cluster-config-file", os.path.join(directory, "nodes.conf"),
                    "--cluster-port", str(free_port()), "--cluster-announce-ip", HOST,
                    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                    "--cluster-require-full-coverage", REQUIRE_FULL_COVERAGE,
                    # DEBUG SLEEP stalls a node on purpose in fault tests (loopback clients only).
                    "--enable-debug-command", "local"]

        try:
            port = process.start(command, _is_ready_line, timeout_s=max(0.0, deadline - time.monotonic()),
                                 attempts=attempts, remove_after_stop=directory)
        except ServerNotReady as error:
            raise RedisClusterUnavailable(
                f"cluster node {index} did not start on {HOST}: {str(error)[-OUTPUT_TAIL_CHARS:]}"
            ) from error
        self._nodes.append((HOST, port))

    def _create(self, cli: str, deadline: float) -> None:
        """``redis-cli --cluster create``: slots spread evenly over the primaries, the nodes introduced."""
        argv = [cli, "--cluster", "create", *(f"{host}:{port}" for host, port in self._nodes),
                "--cluster-replicas", "0", "--cluster-yes"]
        timeout_s = max(0.0, deadline - time.monotonic())
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as error:  # subprocess.run has SIGKILLed and reaped it
            raise RedisClusterUnavailable(
                f"redis-cli --cluster create did not finish within {timeout_s:.3g} s.\ncommand: {' '.join(argv)}\n"
                f"output:\n{_tail(error.output)}"
            ) from error
        if done.returncode != 0:
            raise RedisClusterUnavailable(
                f"redis-cli --cluster create failed (exit status {done.returncode}).\ncommand: {' '.join(argv)}\n"
                f"output:\n{_tail(done.stdout)}"
            )

    def stop(self) -> None:
        """Stop every node by its PID (SIGTERM to its guard, SIGKILL if it must; a paused node is resumed
        first, so that it can act on the SIGTERM), reap them, and remove their directories. Idempotent."""
        for index in sorted(self._paused):
            self._signal_node(index, signal.SIGCONT)
        self._paused.clear()
        for client in self._admin:
            client.close()
        self._admin = []
        self._stop_processes()
        for directory in self._directories:
            shutil.rmtree(directory, ignore_errors=True)  # the guards have removed them, unless a node died
        self._down.clear()
        self._migrations.clear()

    def _stop_processes(self) -> None:
        """Stop every node's process at once: a redis-server acts on SIGTERM at its next ``serverCron``
        tick (up to 100 ms), so one by one would add that up."""
        errors: list[BaseException] = []

        def stop(process: ServerProcess) -> None:
            try:
                process.stop()
            except BaseException as error:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors.append(error)

        threads = [threading.Thread(target=stop, args=(process,), name=f"fastlease-stop-{process.pid}")
                   for process in self._processes]
        for thread in threads:
            thread.start()
        for thread in threads:
            # ServerProcess.stop is bounded (SIGTERM, then SIGKILL, each wait GUARD_GRACE_S-bounded).
            thread.join(timeout=4 * GUARD_GRACE_S)
        if errors:
            raise errors[0]
        alive = [thread.name for thread in threads if thread.is_alive()]
        if alive:
            raise RuntimeError(f"stopping these nodes did not end within {4 * GUARD_GRACE_S:g} s: {alive}")

    def __enter__(self) -> "RedisClusterServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- convergence --------------------------------------------------------------------------------------

    def _agreement(self) -> Optional[str]:
        """None when every reachable node says ``cluster_state:ok`` and all report the same owner for every
        slot, else what is not so yet."""
        return disagreement([(index, self._admin[index]) for index in self._live()])

    def _wait_until_agreed(self, deadline: float, what: str) -> None:
        """Poll :meth:`_agreement` until it holds; RedisClusterUnavailable at ``deadline``, with the last answer."""
        while True:
            problem = self._agreement()
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise RedisClusterUnavailable(f"the cluster's nodes did not agree {what} in time: {problem}")
            time.sleep(POLL_S)  # a polling interval: nothing signals that the nodes have converged

    def wait_until_agreed(self, timeout_s: float = STEP_TIMEOUT_S) -> None:
        """Wait until every reachable node (neither killed nor paused) says ``cluster_state:ok`` and all report
        the same owner for every slot: after a test changed the cluster behind this object's back (with
        ``redis-cli --cluster reshard``, say). RedisClusterUnavailable after ``timeout_s``."""
        self._require_running()
        self._wait_until_agreed(time.monotonic() + timeout_s, what=f"within {timeout_s:g} s")

    def admin(self, node: Node | int) -> "redis.Redis":
        """The admin connection (a ``redis.Redis``, bytes replies) to one node: for ``DBSIZE``, ``CLUSTER
        COUNTKEYSINSLOT`` and the like. It belongs to this object: do not close it."""
        index = self._index_of(node)
        self._require_reachable(index)
        client: "redis.Redis" = self._admin[index]
        return client


    # --- slots and migrations -----------------------------------------------------------------------------

    def node_for_slot(self, slot: int) -> Node:
        """The (host, port) of the node that owns ``slot`` (0-16383) now, as the first reachable node sees
        it. A slot being migrated is still its source's until :meth:`finish_migration`."""
        check_slot(slot)
        self._require_running()
        reply = self._admin[self._live()[0]].execute_command("CLUSTER", "SLOTS")
        for first, last, owner in slot_ranges(reply):
            if first <= slot <= last:
                return owner
        raise RedisClusterUnavailable(f"no node owns slot {slot}: CLUSTER SLOTS says {reply!r}")

    def migrate_slot(self, slot: int, to: Node | int, keys: bool = True, timeout_s: float = STEP_TIMEOUT_S) -> int:
        """Move ``slot`` to the node ``to`` ((host, port) or its number) as ``redis-cli --cluster reshard``
        does: :meth:`begin_migration`, then :meth:`finish_migration`, which moves every key of the slot and
        hands it over. Returns the number of keys moved. ``keys=False`` is for a slot the test knows is
        empty: Redis refuses to hand over a slot whose keys are still on its source, and so does this, with
        ValueError, before any step. Each step is bounded by ``timeout_s`` (TimeoutError)."""
        check_slot(slot)
        if not keys:
            self._require_running()
            source = self.node_for_slot(slot)
            left = int(self._admin_of(source).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
            if left:
                raise ValueError(f"slot {slot} holds {left} keys on {source[0]}:{source[1]}: "
                                 "migrate_slot(..., keys=True) moves them with it")
        self.begin_migration(slot, to)
        return self.finish_migration(slot, timeout_s=timeout_s)

    def begin_migration(self, slot: int, to: Node | int) -> None:
        """The first steps of a migration of ``slot`` from its owner to ``to``: ``CLUSTER SETSLOT <slot>
        IMPORTING <source id>`` on the target, then ``MIGRATING <target id>`` on the source. From then on the
        source answers a command on a key of the slot that it no longer holds with ``-ASK <slot> <target>``,
        and the target serves such a key only after ``ASKING``. ValueError if the slot is already being
        migrated or already lives on ``to``."""
        check_slot(slot)
        self._require_running()
        if slot in self._migrations:
            raise ValueError(f"slot {slot} is already being migrated: call finish_migration({slot}) first")
        target = self._index_of(to)
        source = self._index_of(self.node_for_slot(slot))
        if source == target:
            raise ValueError(f"slot {slot} already lives on node {target} ({self._address(target)})")
        for index in (source, target):
            self._require_reachable(index)
        self._admin[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self._node_ids[source])
        self._admin[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self._node_ids[target])
        self._migrations[slot] = (source, target)

    def move_keys(self, slot: int, count: Optional[int] = None, timeout_s: float = STEP_TIMEOUT_S) -> int:
        """``MIGRATE`` up to ``count`` keys (None: all) of ``slot`` from the source to the target of the
        migration that :meth:`begin_migration` began, :data:`MIGRATE_BATCH` keys a round, the keys that
        ``CLUSTER GETKEYSINSLOT`` lists; returns the number moved. A moved key is on the target only: the
        source answers ASK for it. ValueError without a migration of ``slot`` in progress; TimeoutError if
        the keys are not all moved within ``timeout_s``."""
        check_slot(slot)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"count must be None (every key) or an int of 0 or more, not {count!r}")
        source, target = self._migration(slot)
        host, port = self._nodes[target]
        deadline = time.monotonic() + timeout_s
        moved = 0
        while count is None or moved < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"moved {moved} keys of slot {slot} in {timeout_s:g} s, and some are left")
            batch = MIGRATE_BATCH if count is None else min(MIGRATE_BATCH, count - moved)
            names = self._admin[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not names:
                break
            # Without REPLACE: the target can hold no key of the slot that the source still holds (the
            # source answers ASK only for keys it does not have), so BUSYKEY would be a real fault.
            self._admin[source].execute_command("MIGRATE", host, port, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *names)
            moved += len(names)
        return moved

    def finish_migration(self, slot: int, timeout_s: float = STEP_TIMEOUT_S) -> int:
        """The last steps of the migration of ``slot``: :meth:`move_keys` of whatever is left (their number
        is returned), then
        ``CLUSTER SETSLOT <slot> NODE <target id>`` on the target first (which bumps its config epoch, so its
        claim wins), the source next, then every other node, as ``redis-cli`` does; returns once every
        reachable node reports the target as the slot's owner (RedisClusterUnavailable after ``timeout_s``)."""
        source, target = self._migration(slot)
        moved = self.move_keys(slot, timeout_s=timeout_s)
        others = [index for index in self._live() if index not in (source, target)]
        for index in (target, source, *others):
            self._admin[index].execute_command("CLUSTER", "SETSLOT", slot, "NODE", self._node_ids[target])
        del self._migrations[slot]
        deadline = time.monotonic() + timeout_s
        while True:
            problem = self._agreement()
            if problem is None and self.node_for_slot(slot) == self._nodes[target]:
                return moved
            if time.monotonic() >= deadline:
                raise RedisClusterUnavailable(f"slot {slot} was handed to node {target}, but within "
                                              f"{timeout_s:g} s: {problem or 'another node still owns it'}")
            time.sleep(POLL_S)  # a polling interval: nothing signals that the nodes have converged

    # --- faults -------------------------------------------------------------------------------------------

    def kill_node(self, node: Node | int) -> None:
        """SIGKILL the node's ``redis-server`` by its PID (no shutdown of its own runs) and reap it; its slots
        fail once the others notice (after :data:`NODE_TIMEOUT_MS`), the other nodes keep serving theirs.
        A killed node stays down until stop()."""
        index = self._index_of(node)
        self._require_reachable(index)
        self._down.add(index)
        self._signal_node(index, signal.SIGKILL)
        self._admin[index].close()
        self._processes[index].stop()  # the guard has seen its server die; this reaps the guard

    def pause_node(self, node: Node | int) -> None:
        """SIGSTOP the node's ``redis-server`` by its PID: it holds its connections and answers nothing, as a
        stalled machine would, until :meth:`resume_node`. Admin calls to a paused node would wait
        :data:`ADMIN_TIMEOUT_S`; the methods here leave it out. stop() resumes it before it stops it."""
        index = self._index_of(node)
        self._require_reachable(index)
        self._signal_node(index, signal.SIGSTOP)
        self._paused.add(index)

    def resume_node(self, node: Node | int) -> None:
        """SIGCONT a node that :meth:`pause_node` stopped."""
        index = self._index_of(node)
        if index not in self._paused:
            raise ValueError(f"node {index} ({self._address(index)}) is not paused: pause_node({index}) first")
        self._signal_node(index, signal.SIGCONT)
        self._paused.discard(index)

    def flushall(self) -> None:
        """``FLUSHALL`` on every primary (every node: this cluster has no replicas) that is neither killed nor
        paused."""
        self._require_running()
        for index in self._live():
            self._admin[index].flushall()

    # --- helpers ------------------------------------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running():
            raise RuntimeError("RedisClusterServer is not running; call start() first")

    def _live(self) -> list[int]:
        """The nodes admin commands can reach: neither killed nor paused (RedisClusterUnavailable if none)."""
        live = [index for index in range(len(self._nodes)) if index not in self._down and index not in self._paused]
        if not live:
            raise RedisClusterUnavailable("every node of the cluster is killed or paused")
        return live

    def _address(self, index: int) -> str:
        host, port = self._nodes[index]
        return f"{host}:{port}"

    def _index_of(self, node: Node | int) -> int:
        self._require_running()
        if isinstance(node, int) and not isinstance(node, bool) and 0 <= node < len(self._nodes):
            return node
        if isinstance(node, tuple) and node in self._nodes:
            return self._nodes.index(node)
        raise ValueError(f"{node!r} is not a node of this cluster: give a number from 0 to {len(self._nodes) - 1} "
                         f"or one of {self._nodes}")

    def _admin_of(self, node: Node) -> Any:
        return self._admin[self._index_of(node)]

    def _require_reachable(self, index: int) -> None:
        if index in self._down:
            raise ValueError(f"node {index} ({self._address(index)}) was killed: it stays down until stop()")
        if index in self._paused:
            raise ValueError(f"node {index} ({self._address(index)}) is paused: resume_node({index}) first")

    def _migration(self, slot: int) -> tuple[int, int]:
        check_slot(slot)
        self._require_running()
        try:
            return self._migrations[slot]
        except KeyError:
            raise ValueError(f"no migration of slot {slot} is in progress: call begin_migration({slot}, to) "
                             "first") from None

    def _signal_node(self, index: int, signum: int) -> None:
        os.kill(self._server_pids[index], signum)


def _tail(output: Optional[bytes | str]) -> str:
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else (output or "")
    return _ANSI_ESCAPE.sub("", text)[-OUTPUT_TAIL_CHARS:]



def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastlease.testing.redis_cluster``: see the module docstring."""
    cluster = RedisClusterServer()
    return serve_until_stopped("python -m fastlease.testing.redis_cluster",
                               "a throwaway three-node Redis Cluster on 127.0.0.1, no persistence",
                               lambda port: cluster.start(), cluster.stop, RedisClusterUnavailable, argv,
                               port_option=False)


if __name__ == "__main__":
    sys.exit(main())
