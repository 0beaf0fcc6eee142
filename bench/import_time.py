"""What ``import fastlease`` costs, beside the peers' imports, in one run.

Each figure is the median of ``--runs`` fresh interpreters (``python -X importtime -c "import X"``,
the cumulative time of X): fastlease with its compiled engine, with the interpreted one
(FASTLEASE_NO_EXTENSIONS=1), pydynox 1.8.0, redis-py and boto3; and the whole process against a bare
interpreter (``-c pass``). Run: ``make bench`` or ``.venv/bin/python bench/import_time.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SUBJECTS = (
    ("fastlease (compiled engine)", "fastlease", {}),
    ("fastlease (interpreted engine)", "fastlease", {"FASTLEASE_NO_EXTENSIONS": "1"}),
    ("pydynox 1.8.0", "pydynox", {}),
    ("redis-py", "redis", {}),
    ("boto3", "boto3", {}),
)


def import_ms(module: str, env: dict[str, str]) -> float:
    """The cumulative import time of ``module`` in a fresh interpreter, from -X importtime (ms)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, **env}, check=True)
    for line in reversed(result.stderr.splitlines()):
        fields = [field.strip() for field in line.split("|")]
        if len(fields) == 3 and fields[2] == module:
            return int(fields[1]) / 1000
    raise RuntimeError(f"no importtime line for {module}")


def process_ms(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print(f"import time, median of {runs} fresh interpreters (python -X importtime, cumulative ms); "
          f"Python {sys.version.split()[0]}")
    for label, module, env in SUBJECTS:
        samples = [import_ms(module, env) for _ in range(runs)]
        print(f"  {label:32} {statistics.median(samples):7.1f} ms   (min {min(samples):.1f}, max {max(samples):.1f})")
    bare = statistics.median(process_ms("pass") for _ in range(runs))
    whole = statistics.median(process_ms("import fastlease") for _ in range(runs))
    print(f"  whole process: bare interpreter {bare:.1f} ms, with import fastlease {whole:.1f} ms "
          f"(+{whole - bare:.1f} ms)")


if __name__ == "__main__":
    main()
