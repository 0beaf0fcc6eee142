"""Worker functions for the multi-process tests (DynamoDB, SQLite, Redis, PostgreSQL), run in
``multiprocessing`` *spawn* children.

Every function here runs in a fresh interpreter (the tests directory is on ``sys.path``, so the child
imports this file as ``helpers.mp_workers``). Each one builds its own clients from the endpoint it is given and
talks to the parent through two one-way Pipes: ``out`` (child -> parent: reports) and ``ctl``
(parent -> child: instructions). Pipes have no locks shared between processes, so SIGKILLing or
SIGSTOPping a child can never wedge the parent's end. Every wait is bounded by a timeout.

Reports are tuples whose first element names them: ``("ready", pid)``, ``("held", pid, owner)``,
``("done", pid, payload)`` or ``("error", pid, traceback_text)``.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from typing import Any, Dict, Optional

REGION = "us-east-1"
#: Bound for every wait on the parent; a child that is never told anything gives up after this.
WAIT_S = 60.0
#: How long one contended acquisition may wait before the worker gives up (LockNotAcquired).
CONTEND_WAIT_S = 30.0


# ---- clients (also used by the parent) ----------------------------------------------------------
def boto3_session() -> Any:
    import boto3

    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)


def fastlease_client(endpoint: str, fast_path: bool = True, renewal: str = "auto") -> Any:
    """A client on the moto server at ``endpoint``, on the SQLite file of ``sqlite:PATH``, on the Redis
    server of a ``redis://`` URL (the cluster of a ``redis+cluster://`` URL), or on the PostgreSQL database
    of a ``postgresql://`` DSN. ``renewal``: the client's option ("auto": the renewal process)."""
    if endpoint.startswith("postgresql://"):
        from fastlease import PostgresClient

        return PostgresClient(endpoint, renewal=renewal)
    if endpoint.startswith("sqlite:"):
        from fastlease import SQLiteClient

        return SQLiteClient(endpoint[len("sqlite:"):], renewal=renewal)
    if endpoint.startswith(("redis://", "redis+cluster://")):
        from fastlease.redis import RedisClient

        return RedisClient(endpoint, renewal=renewal)
    from fastlease.dynamodb import DynamoDBClient

    return DynamoDBClient(session=boto3_session(), endpoint_url=endpoint, fast_path=fast_path, renewal=renewal)


def pydynox_client(endpoint: str) -> Any:
    from pydynox import DynamoDBClient

    return DynamoDBClient(region=REGION, access_key="testing", secret_key="testing", endpoint_url=endpoint)


# ---- helpers ------------------------------------------------------------------------------------
def _wait_message(ctl: Any, timeout_s: float = WAIT_S) -> Any:
    if not ctl.poll(timeout_s):
        raise TimeoutError(f"no instruction from the parent within {timeout_s:g} s")
    return ctl.recv()


def expect(ctl: Any, instruction: str) -> None:
    """Wait (bounded) for the parent's next instruction, which must be ``instruction``."""
    message = _wait_message(ctl)
    if message != instruction:
        raise RuntimeError(f"expected {instruction!r}, got {message!r}")


def ready_for(out: Any, ctl: Any, instruction: str, *details: Any) -> None:
    """Report ``("ready", pid, *details)``, then wait for ``instruction``."""
    out.send(("ready", os.getpid(), *details))
    expect(ctl, instruction)


def _report_error(out: Any) -> None:
    try:
        out.send(("error", os.getpid(), traceback.format_exc()))
    except OSError:  # the parent is gone: nobody to tell
        pass


def describe(error: Optional[BaseException]) -> Dict[str, Any]:
    """A picklable summary of an outcome: what was raised, its cause and what it was chained from."""
    if error is None:
        return {"type": None}
    chained = error.__cause__
    return {
        "type": type(error).__name__,
        "module": type(error).__module__,
        "cause": getattr(error, "cause", None),
        "chained": None if chained is None else type(chained).__name__,
        "message": str(error),
    }


def _outcome(action: Any) -> Dict[str, Any]:
    try:
        action()
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which asserts on it
        return describe(error)
    return describe(None)


def hold_in_block(guard: Any, body: Any) -> Dict[str, Any]:
    """Run ``body(lease, outcomes)`` inside ``with guard``; ``outcomes`` (returned) also gets what leaving
    the block raised ("exit": a LockLost or nothing), and the guard's ``lost_cause`` and ``state`` after."""
    from fastlease import LockLost

    outcomes: Dict[str, Any] = {}
    try:
        with guard as lease:
            body(lease, outcomes)
    except LockLost as error:
        outcomes["exit"] = describe(error)
    else:
        outcomes["exit"] = describe(None)
    outcomes["lost_cause"] = guard.lost_cause
    outcomes["state"] = guard.state
    return outcomes


# ---- workers ------------------------------------------------------------------------------------
def contend(endpoint: str, table: str, key: str, rounds: int, fast_path: bool, lease_s: float,
            out: Any, ctl: Any) -> None:
    """Acquire ``key`` ``rounds`` times, each time recording (monotonic right after acquire returned,
    monotonic right before leaving the block). Reports ``("done", pid, holds)``; each hold is
    (acquired, leaving, owner, pid, wait_ms, fencing_token)."""
    try:
        from fastlease import SyncDistributedLock

        client = fastlease_client(endpoint, fast_path)
        try:
            ready_for(out, ctl, "start")
            rng = random.Random()
            holds = []
            for _ in range(rounds):
                guard = SyncDistributedLock(
                    client, table=table, key=key, lease_duration=lease_s, wait_timeout=CONTEND_WAIT_S
                )
                with guard as lease:
                    acquired = time.monotonic()
                    lease.raise_if_lost()
                    time.sleep(rng.uniform(0.005, 0.03))  # the work done under the lease (not synchronisation)
                    lease.raise_if_lost()
                    owner = lease.owner
                    leaving = time.monotonic()
                holds.append((acquired, leaving, owner, os.getpid(), lease.metrics.wait_ms, lease.fencing_token))
                # Work outside the lease, so that the releasing process does not simply win every
                # next round with its immediate put while the others are between polls.
                time.sleep(rng.uniform(0.0, 0.12))
            out.send(("done", os.getpid(), holds))
        finally:
            client.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def warm_up_renewal_process(client: Any, table: str, lease_s: float) -> Optional[int]:
    """Hold a key of this process's own until the client's renewal process (started at its first lease of
    1 s or more) has reported ready, so that it renews the leases that follow from their start; its PID.
    A first lease whose renewal process starts late lapses (safely) before its first renewal: this one
    may, on a busy machine."""
    from fastlease import LockLost, SyncDistributedLock

    link = None
    try:
        with SyncDistributedLock(client, table=table, key=f"warm-up-{os.getpid()}", lease_duration=lease_s):
            link = client.engine.link
            deadline = time.monotonic() + WAIT_S
            while link is not None and link.pid is None and time.monotonic() < deadline:  # bounded by WAIT_S
                time.sleep(0.01)  # nothing signals the start: its READY report is read when we look
    except LockLost:
        pass
    return None if link is None else link.pid


def hold_keys(table: str, lease_s: float, hold_s: tuple, out: Any, ctl: Any) -> None:
    """Told (endpoint, keys) first (so that the interpreter starts while the parent starts the store), then,
    until told "stop": hold one of ``keys`` (drawn at random, so that processes contend) for a time drawn
    from ``hold_s`` (low, high), looking at the lease every 20 ms. Reports ``("ready", pid, renewal_pid)``
    once its renewal process runs (:func:`warm_up_renewal_process`), each acquisition at once,
    ``("held", pid, key, owner, token)``, and at the end ``("done", pid, holds, not_acquired)``, each hold
    (key, acquired, last_valid, owner, token, exit_cause, lost_causes): ``last_valid`` is the monotonic
    time of its last check that passed, ``exit_cause`` None for a hold released as held, else the cause of
    the LockLost it ended with, ``lost_causes`` what ``on_lost`` was called with."""
    try:
        from fastlease import LockLost, LockNotAcquired, SyncDistributedLock

        endpoint, keys = _wait_message(ctl)
        client = fastlease_client(endpoint)
        try:
            ready_for(out, ctl, "start", warm_up_renewal_process(client, table, lease_s))
            rng = random.Random()
            holds = []
            not_acquired = 0
            deadline = time.monotonic() + WAIT_S
            while not ctl.poll() and time.monotonic() < deadline:  # bounded: "stop", or WAIT_S at most
                key = rng.choice(keys)
                lost_causes: list = []
                guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s,
                                            wait_timeout=CONTEND_WAIT_S,
                                            on_lost=lambda lost, causes=lost_causes: causes.append(lost.cause))
                acquired = last_valid = 0.0
                token = owner = None
                exit_cause = None
                try:
                    with guard as lease:
                        acquired = last_valid = time.monotonic()
                        token, owner = lease.fencing_token, lease.owner
                        out.send(("held", os.getpid(), key, owner, token))
                        end = acquired + rng.uniform(*hold_s)
                        while time.monotonic() < end and not ctl.poll():  # bounded: the hold, or "stop"
                            lease.raise_if_lost()
                            last_valid = time.monotonic()
                            lease.lost.wait(0.02)  # the work done under the lease (woken early by a loss)
                        lease.raise_if_lost()
                        last_valid = time.monotonic()
                except LockNotAcquired:
                    not_acquired += 1
                    continue
                except LockLost as error:
                    exit_cause = error.cause
                holds.append((key, acquired, last_valid, owner, token, exit_cause, lost_causes))
            out.send(("done", os.getpid(), holds, not_acquired))
        finally:
            client.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def hold_until_killed(endpoint: str, table: str, key: str, lease_s: float, library: str, fast_path: bool,
                      out: Any, ctl: Any) -> None:
    """Hold ``key`` with ``library`` ("fastlease" or "pydynox"), report ``("held", pid, owner)`` (owner is
    None for pydynox, which does not expose it) and wait for an instruction. The parent SIGKILLs it
    while it waits; if it is told "release" instead, it releases and reports ``("done", pid, None)``."""
    try:
        if library == "fastlease":
            from fastlease import SyncDistributedLock

            client = fastlease_client(endpoint, fast_path)
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=10)
            try:
                with guard as lease:
                    out.send(("held", os.getpid(), lease.owner))
                    _wait_message(ctl)
            finally:
                client.close()
        elif library == "pydynox":
            from pydynox.lock import SyncDistributedLock as PydynoxLock

            pclient = pydynox_client(endpoint)
            with PydynoxLock(pclient, table=table, key=key, lease_duration=lease_s, wait_timeout=10):
                out.send(("held", os.getpid(), None))
                _wait_message(ctl)
        else:
            raise ValueError(f"unknown library {library!r}")
        out.send(("done", os.getpid(), None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def commit_after_stop(endpoint: str, table: str, results_table: str, key: str, lease_s: float,
                      out: Any, ctl: Any) -> None:
    """Hold ``key``, prepare a transaction checked in to the lease, report ``("held", pid, owner)`` and wait
    for "go" (the parent SIGSTOPs us meanwhile and takes the key over). Then try to commit, check the
    lease and leave the block, and report ``("done", pid, outcomes)`` with what each step raised."""
    try:
        from fastlease import SyncDistributedLock
        from fastlease.dynamodb import SyncTransaction

        client = fastlease_client(endpoint)

        def body(lease: Any, outcomes: Dict[str, Any]) -> None:
            tx = SyncTransaction(client)
            lease.check_in(tx)
            tx.put(results_table, {"id": key, "v": 1, "writer": lease.owner})
            outcomes["valid_before_stop"] = lease.is_valid()
            out.send(("held", os.getpid(), lease.owner))
            outcomes["instruction"] = _wait_message(ctl)
            outcomes["commit"] = _outcome(tx.commit)
            outcomes["raise_if_lost"] = _outcome(lease.raise_if_lost)
            outcomes["valid_after_commit"] = lease.is_valid()

        try:
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=10)
            outcomes = hold_in_block(guard, body)
        finally:
            client.close()
        out.send(("done", os.getpid(), outcomes))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def idempotent_once(endpoint: str, table: str, key: str, hold_s: float, lease_s: float,
                    out: Any, ctl: Any) -> None:
    """Call an idempotent operation on ``key`` once, when told "go". The handler reports
    ("running", pid, None) and works for ``hold_s``. Reports ("done", pid, (executed, result))."""
    try:
        from fastlease.idempotency import IdempotentCall

        client = fastlease_client(endpoint)
        try:
            ready_for(out, ctl, "go")
            with IdempotentCall(client, table=table, key=key, payload={"amount": 10}, lease_duration=lease_s,
                                wait=CONTEND_WAIT_S) as call:
                if call.replayed:
                    outcome = (False, call.result)
                else:
                    out.send(("running", os.getpid(), None))
                    time.sleep(hold_s)  # the handler's work (the parent may SIGKILL us here)
                    result = {"charged_by": os.getpid()}
                    call.complete(result)
                    outcome = (True, result)
            out.send(("done", os.getpid(), outcome))
        finally:
            client.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


# ---- PostgreSQL: the guarded counter (tests/stores/test_postgres_processes.py) -------------------
#: The counter and its commit log, as the PostgreSQL tests create them.
PG_COUNTER = "SELECT value FROM counter WHERE id = 1"
PG_WRITE_COUNTER = "UPDATE counter SET value = %s WHERE id = 1"
PG_LOG_COMMIT = "INSERT INTO commits (value, owner) VALUES (%s, %s)"
#: The 5 ms between the read and the write, where another writer would slip in without the lease.
PG_WORK_S = 0.005


def pg_increment(lease: Any, connection: Any, work_s: float = PG_WORK_S) -> None:
    """In the transaction open on ``connection``: check in to the lease, read the counter, wait
    ``work_s``, write counter+1 and log (value, owner). The caller commits."""
    lease.check_in(connection)
    (value,) = connection.execute(PG_COUNTER).fetchone()
    time.sleep(work_s)  # the work between the read and the write (not synchronisation)
    connection.execute(PG_WRITE_COUNTER, (value + 1,))
    connection.execute(PG_LOG_COMMIT, (value + 1, lease.owner))


def pg_counter(dsn: str, table: str, key: str, rounds: int, lease_s: float, out: Any, ctl: Any) -> None:
    """``rounds`` times: hold ``key`` and, in one psycopg transaction, check in, read the counter,
    wait 5 ms and write counter+1, then commit. Reports ``("done", pid, commits)``: the transactions
    that committed (one that raised is rolled back and not counted)."""
    try:
        import psycopg

        from fastlease import SyncDistributedLock

        client = fastlease_client(dsn)
        connection = psycopg.connect(dsn)
        try:
            ready_for(out, ctl, "start")
            rng = random.Random()
            commits = 0
            for _ in range(rounds):
                with SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s,
                                         wait_timeout=CONTEND_WAIT_S) as lease:
                    with connection.transaction():
                        pg_increment(lease, connection)
                    commits += 1
                time.sleep(rng.uniform(0.0, 0.03))  # outside the lease, so that others win turns too
            out.send(("done", os.getpid(), commits))
        finally:
            connection.close()
            client.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)


def pg_stop_in_transaction(dsn: str, table: str, key: str, lease_s: float, checked_in: bool,
                           out: Any, ctl: Any) -> None:
    """Hold ``key``, open a transaction and, if ``checked_in``, run the whole increment in it (check_in,
    read, write) but do not commit. Report ``("held", pid, owner, backend_pid)`` and wait for "go" (the
    parent SIGSTOPs us meanwhile). Then finish: check in (when not done yet) and increment, commit; report
    ``("done", pid, outcomes)`` with what the transaction ("transaction"), the lease row's own check
    ("row_check", when not checked in before the stop) and the block's exit raised."""
    try:
        import psycopg

        from fastlease import SyncDistributedLock

        client = fastlease_client(dsn)
        connection = psycopg.connect(dsn)

        def body(lease: Any, outcomes: Dict[str, Any]) -> None:
            connection.execute("SELECT 1")  # the transaction is open (psycopg begins one implicitly)
            if checked_in:
                pg_increment(lease, connection)
            outcomes["valid_before_stop"] = lease.is_valid()
            out.send(("held", os.getpid(), lease.owner, connection.info.backend_pid))
            outcomes["instruction"] = _wait_message(ctl)

            def finish() -> None:
                try:
                    if not checked_in:
                        pg_increment(lease, connection)
                    connection.commit()
                except BaseException:
                    connection.rollback()
                    raise

            outcomes["transaction"] = _outcome(finish)
            if not checked_in:
                # The lease row's own answer, past the local validity check that refuses first (a holder
                # whose clock misled it would get this far): the client's part of check_in.
                def row_check() -> None:
                    try:
                        lease._lease.client._check_in(lease._lease, connection)
                    finally:
                        connection.rollback()

                outcomes["row_check"] = _outcome(row_check)

        try:
            guard = SyncDistributedLock(client, table=table, key=key, lease_duration=lease_s, wait_timeout=10)
            outcomes = hold_in_block(guard, body)
        finally:
            connection.close()
            client.close()
        out.send(("done", os.getpid(), outcomes))
    except BaseException:  # noqa: BLE001 - reported to the parent
        _report_error(out)
