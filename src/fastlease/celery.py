"""Celery tasks that run at most once at a time per key, and tasks whose redelivery runs once
(``pip install 'fastlease[celery]'``, with the extra of your lease store)::

    from celery import Celery
    from fastlease.celery import TaskLeases
    from fastlease.redis import RedisClient

    app = Celery("billing", broker="redis://broker.internal/0")
    leases = TaskLeases(lambda: RedisClient("redis://locks.internal/0"))   # made in each worker process

    @app.task(bind=True)
    @leases.singleton(table="locks", key="report:{account_id}")           # one report per account at a time
    def build_report(self, account_id: str) -> None: ...

    @app.task(bind=True, acks_late=True, task_reject_on_worker_lost=True)
    @leases.idempotent(table="task_results")                              # keyed on the task id
    def charge(self, payment_id: str, cents: int) -> dict: ...

The decorators go *under* ``@app.task``, on the function itself.

**The client of each process.** ``TaskLeases`` takes a function that makes a client, not a client: it
is called once in each process that runs a task (each prefork child, on its first task), because a
client holds a renewal thread and connections that a forked child cannot use. A worker's parent
process never makes one unless it runs tasks itself (the solo and threads pools). A prefork child
closes its client when it shuts down (Celery's ``worker_process_shutdown`` signal).

**Singleton tasks.** ``singleton(table=, key=)`` holds a lease on ``key``, a template over the task's
arguments, while the body runs, renewed in the background like every fastlease lease. If another task
holds the key, the task is not run, and never reported as done:

* ``on_busy="retry"`` (the default): ``task.retry(countdown=retry_delay)``, counted against the task's
  ``max_retries`` (or the ``max_retries`` given here); once they are spent the task fails with
  :class:`~fastlease.LockNotAcquired`, which names the key;
* ``on_busy="skip"``: the task's state becomes ``SKIPPED`` (with a result backend) and it raises
  Celery's ``Ignore``: the message is acknowledged, and the result is neither a success nor a failure.

A lease lost while the body runs makes the task fail with :class:`~fastlease.LockLost` once it ends, as
the guard's ``with`` block does: its work may have overlapped with another holder's. In the body,
``leases.current_lease()`` is the task's lease: its fencing token, ``raise_if_lost()``, ``remaining()``.

**Idempotent tasks.** ``idempotent(table=)`` runs the body once per key, by default the task's id (a
redelivered message keeps it), or ``key=`` a template over the arguments; a redelivery after the body
completed returns the stored result, and the body does not run again. The in-flight record is a lease,
so a redelivery of a task whose worker was SIGKILLed waits up to ``wait`` seconds (by default one and
a half leases, enough to take over the dead worker's lease after one whole lease) and then runs the
body; one that finds a live call still running after ``wait`` is retried after ``retry_delay``
seconds. Results are stored as JSON by default (``serializer=``), for ``ttl`` seconds. The failure
policy, ``retry_on``, is :class:`~fastlease.idempotency.IdempotentCall`'s: by default every exception
stores nothing, so Celery's own retry of a failed task runs the body again.

Every option is checked when the decorator is applied (TypeError or ValueError, naming the option);
nothing is sent to any store until a task runs. Nothing of Celery is imported by ``import fastlease``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from typing import Any, Callable, Literal, Optional, ParamSpec, TypeVar, Union, cast

from celery import current_task
from celery.exceptions import Ignore
from celery.signals import worker_process_shutdown

from . import _impl
from .client import LeaseClient
from .decorator import _bind_template, _LockSpec
from .exceptions import LockNotAcquired
from .idempotency.calls import IdempotentCall, RetryOn, _CallSpec
from .idempotency.decorator import _check_payload, _FunctionSpec
from .idempotency.exceptions import IdempotencyInProgress
from .idempotency.records import DEFAULT_TTL
from .idempotency.serialization import JSON, Serializer
from .lock import DEFAULT_LEASE_DURATION, LeaseOptions, SyncDistributedLock, check_client
from .stores.base import check_table

__all__ = ["SKIPPED", "TaskLeases"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The state of a singleton task skipped because its key was busy (``on_busy="skip"``).
SKIPPED = "SKIPPED"
#: The longest retry delay: a day, as the longest lease and the longest wait.
_MAX_RETRY_DELAY_S = 86_400.0


class TaskLeases:
    """Leases for Celery tasks, with one client per worker process: see the module documentation.

    ``make_client`` is a function of no arguments that returns a :class:`~fastlease.client.LeaseClient`
    (say ``lambda: RedisClient(url)``); it is called in each process on its first task, never before.
    Passing a client itself raises TypeError, since a client made before the worker forks cannot be used
    in its children.
    """

    def __init__(self, make_client: Callable[[], LeaseClient]) -> None:
        if isinstance(make_client, LeaseClient) or not callable(make_client):
            raise TypeError(
                f"TaskLeases takes a function that makes the client, got {make_client!r:.80}: pass, for "
                "example, lambda: RedisClient(url), which each worker process calls on its first task (a "
                "client made before the worker forks cannot be used in its children)")
        self._make_client = make_client
        self._guard = threading.Lock()
        self._pid: Optional[int] = None
        self._client: Optional[LeaseClient] = None
        #: Each decorated task's per-process state (its lock or call spec), made with this process's client,
        #: under the task's own build function.
        self._specs: dict[Callable[[LeaseClient], Any], Any] = {}
        #: The lease of the singleton task running in each thread (``current_lease``).
        self._running = threading.local()
        worker_process_shutdown.connect(self._close_at_shutdown, weak=True)

    def current_lease(self) -> SyncDistributedLock:
        """The lease of the singleton task that runs in this thread: its ``fencing_token`` for writes that
        must refuse an older holder (``fastlease.fencing``), ``raise_if_lost()`` between the steps of a
        long body, ``remaining()`` to bound the next one. RuntimeError outside a singleton task's body."""
        lease: Optional[SyncDistributedLock] = getattr(self._running, "lease", None)
        if lease is None:
            raise RuntimeError("current_lease() is for the body of a task decorated with this TaskLeases' "
                               "singleton(): no such task runs in this thread")
        return lease

    def client(self) -> LeaseClient:
        """This process's client, made on first use (again in a forked child: the parent's stays the
        parent's). TypeError if ``make_client`` returns something else than a client."""
        with self._guard:
            return self._process_client()

    def close(self) -> None:
        """Close this process's client, if it made one; the next task makes a new one."""
        with self._guard:
            client, self._client = (self._client, None) if self._pid == os.getpid() else (None, None)
            self._specs = {}
        if client is not None:
            client.close()

    def _close_at_shutdown(self, **_signal: Any) -> None:
        self.close()

    def _process_client(self) -> LeaseClient:
        pid = os.getpid()
        if self._pid != pid or self._client is None:
            # A forked child's copy of the parent's client is left alone: its threads are the parent's.
            client = self._make_client()
            if not isinstance(client, LeaseClient):
                raise TypeError(f"TaskLeases: make_client() must return a fastlease client, got {client!r:.80}")
            self._pid, self._client, self._specs = pid, check_client(client), {}
        return self._client

    def _spec(self, build: Callable[[LeaseClient], Any]) -> Any:
        """The per-process state of the decorated task that ``build`` (its own function) makes, built
        with this process's client once."""
        with self._guard:
            client = self._process_client()
            spec = self._specs.get(build)
            if spec is None:
                spec = self._specs[build] = build(client)
            return spec

    def singleton(
        self,
        *,
        table: str,
        key: str,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait: float = 0.0,
        on_busy: Literal["retry", "skip"] = "retry",
        retry_delay: float = 5.0,
        max_retries: Optional[int] = None,
        max_hold: Optional[float] = None,
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        """Run the task at most once at a time per ``key`` (a template over its arguments), holding a
        lease in ``table`` while it runs. ``wait`` (seconds, 0 by default) is how long a task waits for
        a busy key before ``on_busy`` applies: ``"retry"`` after ``retry_delay`` seconds (at most
        ``max_retries`` times; None keeps the task's own), or ``"skip"``. ``lease_duration`` and
        ``max_hold`` are as for :class:`~fastlease.SyncDistributedLock`."""
        options = LeaseOptions.from_seconds(lease_duration, wait, max_hold, wait_name="wait")
        check_table(table)
        busy = _BusyPolicy(on_busy, retry_delay, max_retries)
        template = _impl.core.KeyTemplate(key)

        def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
            _check_task_function(fn, "singleton")
            _bind_template(_impl.core, template, fn)  # a placeholder that names no argument fails here

            def build(client: LeaseClient) -> _LockSpec:
                call_key = _bind_template(client.engine_module, client.engine_module.KeyTemplate(key), fn)
                return _LockSpec(client, table, call_key, options, False)

            return self._singleton_task(fn, build, busy)

        return decorate

    def _singleton_task(self, fn: Callable[_P, _R], build: Callable[[LeaseClient], _LockSpec],
                        busy: _BusyPolicy) -> Callable[_P, _R]:
        def run_singleton(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            guard = self._spec(build).guard(args, kwargs)
            with contextlib.ExitStack() as held:
                try:
                    held.enter_context(guard)
                except LockNotAcquired as error:
                    busy.apply(error)
                outer = getattr(self._running, "lease", None)  # a singleton task called from another's body
                self._running.lease = guard
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._running.lease = outer

        return _wraps(fn, run_singleton)

    def idempotent(
        self,
        *,
        table: str,
        key: Optional[str] = None,
        payload: Union[Literal[False], tuple[str, ...], None] = None,
        lock_table: Optional[str] = None,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        wait: Optional[float] = None,
        retry_delay: Optional[float] = None,
        max_retries: Optional[int] = None,
        ttl: Optional[float] = DEFAULT_TTL,
        serializer: Serializer = JSON,
        retry_on: RetryOn = (Exception,),
    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
        """Run the task's body once per key: the task's id (``key=None``) or ``key``, a template over
        its arguments; a repeat returns the stored result. ``payload`` is what the fingerprint covers
        (None: every argument but a bound task's ``self``; a tuple of names; False: nothing), so that a
        key reused with other arguments raises :class:`~fastlease.idempotency.IdempotencyKeyMismatch`.
        ``wait`` (seconds; None: 1.5 leases) is how long a repeat waits for a call in flight; after it,
        the task is retried after ``retry_delay`` seconds (None: a third of a lease), at most
        ``max_retries`` times (None: the task's own). ``table``, ``lock_table``, ``lease_duration``,
        ``ttl``, ``serializer`` and ``retry_on`` are :class:`~fastlease.idempotency.IdempotentCall`'s."""
        LeaseOptions.from_seconds(lease_duration, 0.0 if wait is None else wait, wait_name="wait")
        wait_s: float = 1.5 * lease_duration if wait is None else wait  # (1.5 leases are within the limits)
        busy = _BusyPolicy("retry", lease_duration / 3 if retry_delay is None else retry_delay, max_retries)
        # Checked now, before any client exists; each process builds its own spec with them.
        _CallSpec.checked(_impl.core, table, lock_table, lease_duration, wait_s, ttl, serializer, retry_on)
        _check_payload(payload)
        template = None if key is None else _impl.core.KeyTemplate(key)

        def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
            _check_task_function(fn, "idempotent")
            if template is not None:
                _bind_template(_impl.core, template, fn)
            covered = _default_payload(fn) if payload is None else payload
            _FunctionSpec(cast(_CallSpec, None), None, fn, covered)  # payload names that fn lacks fail here

            def build(client: LeaseClient) -> _FunctionSpec:
                spec = _CallSpec(client, table, lock_table, lease_duration, wait_s, ttl, serializer, retry_on)
                call_key = (_TaskIdKey() if key is None else
                            _bind_template(client.engine_module, client.engine_module.KeyTemplate(key), fn))
                return _FunctionSpec(spec, call_key, fn, covered)

            return self._idempotent_task(fn, build, busy)

        return decorate

    def _idempotent_task(self, fn: Callable[_P, _R], build: Callable[[LeaseClient], _FunctionSpec],
                         busy: _BusyPolicy) -> Callable[_P, _R]:
        def run_idempotent(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            call: IdempotentCall = self._spec(build).start(args, kwargs)
            with contextlib.ExitStack() as running:
                try:
                    running.enter_context(call)
                except IdempotencyInProgress as error:
                    busy.apply(error)
                if call.replayed:
                    replayed: _R = call.result  # the serializer's copy of the first run's result
                    return replayed
                result = fn(*args, **kwargs)
                call.complete(result)
                return result

        return _wraps(fn, run_idempotent)


class _BusyPolicy:
    """What a task does when its key is busy: retry later (``task.retry``), or skip (``Ignore``)."""

    __slots__ = ("skip", "retry_delay", "max_retries")

    def __init__(self, on_busy: Any, retry_delay: Any, max_retries: Any) -> None:
        if on_busy not in ("retry", "skip"):
            raise ValueError(f"on_busy must be 'retry' or 'skip', got {on_busy!r}")
        if not _is_number(retry_delay) or not 0 <= retry_delay <= _MAX_RETRY_DELAY_S:
            raise ValueError(f"retry_delay must be seconds from 0 to {_MAX_RETRY_DELAY_S:,.0f}, got {retry_delay!r}")
        if max_retries is not None and (type(max_retries) is not int or max_retries < 0):
            raise ValueError(f"max_retries must be None (the task's own) or an int >= 0, got {max_retries!r}")
        self.skip = on_busy == "skip"
        self.retry_delay = float(retry_delay)
        self.max_retries = max_retries

    def apply(self, busy: Exception) -> None:
        """Raise what ends this delivery without running the body: Celery's Retry (or ``busy`` once the
        retries are spent, or outside a worker), or Ignore after recording the SKIPPED state."""
        task = _running_task(busy)
        if self.skip:
            if task.request.id is not None and not task.request.called_directly:
                task.update_state(state=SKIPPED, meta={"reason": str(busy)})
            raise Ignore() from busy
        options = {} if self.max_retries is None else {"max_retries": self.max_retries}
        raise task.retry(countdown=self.retry_delay, exc=busy, **options)


def _running_task(busy: Exception) -> Any:
    """The Celery task this call runs in; outside one, ``busy`` itself is raised."""
    task = current_task._get_current_object() if current_task else None
    if task is None:
        raise busy
    return task


class _TaskIdKey:
    """The key of an idempotent task keyed on its id: ``celery:<task name>:<task id>``. It stands where
    a bound template would, resolving from the running task instead of the arguments."""

    __slots__ = ()

    def resolve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        task = current_task._get_current_object() if current_task else None
        task_id = getattr(getattr(task, "request", None), "id", None)
        if task is None or task_id is None:
            raise TypeError("an idempotent task keyed on its id must run as a Celery task (delay, apply_async "
                            "or a worker): called directly it has no id; pass key= to key it on its arguments")
        return f"celery:{task.name}:{task_id}"


def _check_task_function(fn: Any, name: str) -> None:
    if not callable(fn) or inspect.isclass(fn):
        raise TypeError(f"{name} wraps a task's function, got {fn!r:.80}: put it under @app.task")
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{name} wraps plain functions (Celery runs tasks as def), got {fn.__qualname__}")
    if hasattr(fn, "apply_async"):
        raise TypeError(f"{name} must go under @app.task, on the function itself, not above it: got the task "
                        f"{getattr(fn, 'name', fn)!r}")


def _default_payload(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Every parameter of ``fn`` but a leading ``self`` (a bound task is passed itself: not a payload)."""
    names = tuple(inspect.signature(fn).parameters)
    return names[1:] if names[:1] == ("self",) else names


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and value == value


def _wraps(fn: Callable[_P, _R], wrapper: Callable[_P, _R]) -> Callable[_P, _R]:
    """``wrapper`` with ``fn``'s name, docstring and signature: Celery names the task, and binds its
    arguments (``typing=True``), from them."""
    import functools

    return functools.wraps(fn)(wrapper)
