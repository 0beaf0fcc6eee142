"""How much CPU time this machine charges a thread for merely waiting, by the length of the wait.

``bench/dynamodb_cycle.py`` reports client CPU per cycle from ``time.process_time``. If a blocked thread
is charged CPU that grows with the time it waits (as a virtual machine's accounting can do), then a
request that waits longer for its server shows more "client CPU" for the same client work. This script
measures that charge, with no network and no fastlease: ``time.sleep(d)``, and a blocking ``recv`` on
a socket pair whose other end answers after ``d``, each timed with ``time.thread_time``.
Run: ``.venv/bin/python bench/wait_cpu.py``.
"""

from __future__ import annotations

import platform
import socket
import sys
import threading
import time

WAITS_S = (0.0005, 0.002, 0.005, 0.02)
TOTAL_S = 1.0  # the time spent waiting for each row, so each row has enough samples


def sleep_cpu_us(wait_s: float) -> float:
    count = max(50, int(TOTAL_S / wait_s))
    started = time.thread_time()
    for _ in range(count):
        time.sleep(wait_s)
    return (time.thread_time() - started) / count * 1e6


def socket_wait_cpu_us(wait_s: float) -> float:
    count = max(50, int(TOTAL_S / wait_s))
    ours, theirs = socket.socketpair()

    def answer() -> None:
        for _ in range(count):
            message = theirs.recv(16)
            time.sleep(wait_s)
            theirs.sendall(message)

    answerer = threading.Thread(target=answer)
    answerer.start()
    ours.settimeout(10.0)
    try:
        started = time.thread_time()
        for _ in range(count):
            ours.sendall(b"x")
            ours.recv(16)
        return (time.thread_time() - started) / count * 1e6
    finally:
        answerer.join(10.0)
        ours.close()
        theirs.close()


def main() -> int:
    print(f"# wait_cpu: Python {platform.python_version()}, {platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("wait ms  sleep: thread CPU us  socket wait: thread CPU us")
    for wait_s in WAITS_S:
        print(f"{wait_s * 1e3:7.1f}  {sleep_cpu_us(wait_s):21.1f}  {socket_wait_cpu_us(wait_s):27.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
