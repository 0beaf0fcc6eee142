"""The public API as a type checker sees it: decorated functions keep their signatures.

One mypy run (``mypy.api``, in-process, cache in ``tmp_path``) checks a user's module, ``USER_CODE``. A
line marked ``# E: code`` must get exactly that error, a line marked ``# R: type`` must reveal exactly
that type, and nothing else may be reported. So a decorator that loosened a signature to ``...`` or a
return type to ``Any`` would fail here twice: its ``assert_type`` lines would error, and the calls with
wrong arguments would no longer be reported.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api  # a test dependency of both groups: the wheel's tests check its py.typed and stubs

import fastlease

USER_CODE = '''
from typing import Any, Coroutine

from typing_extensions import assert_type

from fastlease import (DistributedLock, DynamoDBClient, LeaseMetrics, MemoryClient, RedisClient, SyncDistributedLock,
                       distributed_lock)
from fastlease.idempotency import AsyncIdempotentCall, IdempotentCall, idempotent

client = MemoryClient()


@distributed_lock(client, table="locks", key="sync:{customer_id}")
def sync_customer(customer_id: str, *, full: bool = False) -> int:
    return 1


@distributed_lock(client, table="locks", key="async:{customer_id}")
async def sync_async(customer_id: str, retries: int = 3) -> list[str]:
    return []


@idempotent(client, table="payments", key="payment:{payment_id}")
def pay(payment_id: str, amount: int) -> dict[str, int]:
    return {}


@idempotent(client, table="payments", key="payment:{payment_id}", retry_on=(TimeoutError, ValueError))
async def pay_async(payment_id: str, amount: int) -> float:
    return 0.0


class Service:
    @distributed_lock(client, table="locks", key="svc:{item}")
    def handle(self, item: str) -> bool:
        return True


reveal_type(sync_customer)  # R: def (customer_id: str, *, full: bool =) -> int
reveal_type(sync_async)  # R: def (customer_id: str, retries: int =) -> typing.Coroutine[Any, Any, list[str]]
reveal_type(pay)  # R: def (payment_id: str, amount: int) -> dict[str, int]
reveal_type(pay_async)  # R: def (payment_id: str, amount: int) -> typing.Coroutine[Any, Any, float]

assert_type(sync_customer("c1"), int)
assert_type(sync_customer("c1", full=True), int)
assert_type(pay("p1", 100), dict[str, int])
assert_type(Service().handle("i1"), bool)

sync_customer(1)  # E: arg-type
sync_customer("c1", True)  # E: call-arg
sync_customer("c1", fast=True)  # E: call-arg
pay("p1")  # E: call-arg
pay("p1", "100")  # E: arg-type
Service().handle(2)  # E: arg-type
text: str = pay("p1", 1)  # E: assignment


async def use_async() -> None:
    pending = assert_type(sync_async("c1"), Coroutine[Any, Any, list[str]])
    assert_type(await pending, list[str])
    assert_type(await pay_async("p1", 5), float)
    await sync_async(customer_id=2)  # E: arg-type
    await pay_async("p1")  # E: call-arg
    async with DistributedLock(client, table="locks", key="k") as guard:
        assert_type(guard, DistributedLock)
        assert_type(guard.metrics, LeaseMetrics)
    assert_type(await DistributedLock(client, table="locks", key="k").acquire(), DistributedLock)
    async with AsyncIdempotentCall(client, table="payments", key="k") as async_call:
        assert_type(async_call, AsyncIdempotentCall)


with SyncDistributedLock(client, table="locks", key="k") as lease:
    assert_type(lease, SyncDistributedLock)
    assert_type(lease.fencing_token, int | None)
with IdempotentCall(client, table="payments", key="k") as call:
    assert_type(call, IdempotentCall)
with MemoryClient() as own_client:
    assert_type(own_client, MemoryClient)

SyncDistributedLock(client, table="locks", key="k", lease_duration="5")  # E: arg-type


def clients(url: str) -> tuple[RedisClient, DynamoDBClient]:  # loaded lazily at run time, typed all the same
    return RedisClient(url, wake_on_release=False), DynamoDBClient(endpoint_url=url, fast_path=False)


RedisClient(6379)  # E: arg-type
distributed_lock(client, table="locks")  # E: call-arg
IdempotentCall(client, table="payments", key="k", retry_on=[ValueError])  # E: arg-type
'''

CONFIG = """\
[mypy]
strict = True
{mypy_path}
# The package's own modules are checked by `mypy` on src; here only the user's module reports.
[mypy-fastlease.*]
follow_imports = silent
[mypy-boto3.*,botocore.*]
follow_imports = skip
ignore_missing_imports = True
[mypy-redis.*]
ignore_missing_imports = True
"""

_MESSAGE = re.compile(r"^user_code\.py:(\d+): (error|note): (.*?)(?:  \[([a-z-]+)\])?$")


def _expected() -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    errors, reveals = set(), set()
    for number, line in enumerate(USER_CODE.splitlines(), start=1):
        marker = re.search(r"# ([ER]): (.+)$", line)
        if marker:
            (errors if marker.group(1) == "E" else reveals).add((number, marker.group(2).strip()))
    return errors, reveals


def test_decorators_and_guards_keep_their_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # mypy then names the file as given: user_code.py
    Path("user_code.py").write_text(USER_CODE, encoding="utf-8")
    # The fastlease under test: a source tree is named; an installed one (site-packages, which mypy
    # refuses in mypy_path) is found by mypy itself, with its py.typed and _core.pyi.
    root = Path(fastlease.__file__).resolve().parent.parent
    installed = root.name in ("site-packages", "dist-packages")
    Path("mypy.ini").write_text(CONFIG.format(mypy_path="" if installed else f"mypy_path = {root}"), encoding="utf-8")
    stdout, stderr, _ = api.run([
        "--config-file", "mypy.ini", "--cache-dir", "cache", "--no-error-summary", "--hide-error-context",
        "user_code.py",
    ])
    errors, reveals, unexpected = set(), set(), []
    for line in stdout.splitlines():
        match = _MESSAGE.match(line)
        if match is None:
            unexpected.append(line)
            continue
        number, kind, text, code = int(match.group(1)), match.group(2), match.group(3), match.group(4)
        if kind == "error":
            errors.add((number, code or "?"))
        elif text.startswith("Revealed type is "):
            # (older mypy releases spell builtins out: builtins.str)
            reveals.add((number, text[len('Revealed type is "'):-1].replace("builtins.", "")))
        # other notes explain an error already collected
    expected_errors, expected_reveals = _expected()
    problems = [f"line {n}: expected error [{c}], mypy reported none" for n, c in sorted(expected_errors - errors)]
    problems += [f"line {n}: unexpected error [{c}]" for n, c in sorted(errors - expected_errors)]
    problems += [f"line {n}: expected type {t}, revealed otherwise" for n, t in sorted(expected_reveals - reveals)]
    problems += [f"line {n}: revealed {t}" for n, t in sorted(reveals - expected_reveals)]
    problems += [f"unparsed output: {line}" for line in unexpected]
    assert not problems, "\n".join(problems) + f"\n--- mypy output ---\n{stdout}{stderr}"
