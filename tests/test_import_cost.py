"""``import fastlease`` stays cheap: the modules it must not load (their cost is in bench/import_time.py).

Lambda cold starts and every CLI call pay for the import. Each module below is loaded only when the
feature that needs it is first used: the async guard (asyncio), a store client (sqlite3, ssl, boto3,
redis), the decorator's signature binding (inspect), the interpreted engine (importlib.util), a log
call (logging), or ``fastlease.otel`` (opentelemetry); Celery and Django only by their integrations,
``fastlease.celery`` and ``fastlease.django``, which nothing imports for you; typing is never needed at run time
(fastlease/_typing.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

DEFERRED = ("asyncio", "typing", "logging", "inspect", "sqlite3", "ssl", "subprocess", "socket",
            "importlib.util", "concurrent.futures", "boto3", "botocore", "redis", "uuid", "fastlease._engine_py",
            "opentelemetry", "fastlease.otel", "celery", "kombu", "django", "rest_framework", "fastlease.celery",
            "fastlease.django")


def loaded_after(code: str, **env: str) -> list[str]:
    probe = f"import sys; {code}; import json; print(json.dumps(sorted(sys.modules)))"
    environment = {**os.environ, "FASTLEASE_NO_EXTENSIONS": "0", **env}  # the compiled engine, as installed
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                            env=environment, check=True)
    return list(json.loads(result.stdout))


@pytest.mark.c_extension
def test_import_fastlease_loads_none_of_the_deferred_modules():
    loaded = loaded_after("import fastlease")
    assert [name for name in DEFERRED if name in loaded] == []
    assert "fastlease._engine" in loaded and "fastlease.memory" in loaded  # the import did happen


@pytest.mark.parametrize(("use", "needs"), [
    ("import fastlease; fastlease.DistributedLock", "asyncio"),
    ("import fastlease; fastlease.SQLiteClient", "sqlite3"),
    ("import fastlease.otel", "opentelemetry"),
    ("import fastlease; fastlease.distributed_lock(fastlease.MemoryClient(), table='locks', key='k')(lambda: 0)",
     "inspect"),
])
def test_each_deferred_module_arrives_with_its_feature(use, needs):
    assert needs in loaded_after(use)
