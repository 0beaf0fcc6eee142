"""The renewal process's memory gate (bench/renewal_memory.py) holds: at most 18 MiB of VmRSS on SQLite,
Redis, a Redis Cluster and DynamoDB, and one renewal process for a holder with three clients on two
stores. The script starts its own redis-server, Redis Cluster and moto server and exits 1 when a limit
is exceeded or a store cannot start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "renewal_memory.py"


@pytest.mark.server
@pytest.mark.c_extension
def test_the_renewal_process_stays_under_18_mib_and_is_one_per_holder() -> None:
    done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=180,
                          cwd=BENCH.parent)
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.rstrip().endswith("gate: pass")
    for store in ("sqlite", "redis", "redis-cluster", "dynamodb"):
        assert any(line.split()[:1] == [store] and "MiB" in line for line in done.stdout.splitlines()), store
    assert "renewal processes started 1" in done.stdout
