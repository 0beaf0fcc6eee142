"""The ``fastlease`` command, run as a separate process (``python -m fastlease``), output and exit codes;
and the one store factory that the inspecting commands and the demo share."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import fastlease as fastlease_package
from fastlease import SQLiteClient, SyncDistributedLock, _impl, cli, demo
from fastlease._store_factory import StoreOptions, client_from_options
from fastlease.exceptions import LockLost
from fastlease.memory import MemoryClient
from fastlease.stores.base import check_table
from fastlease.stores.memory import MemoryStore

TIMEOUT_S = 120  # bound for one command (the demo included)


def fastlease(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastlease", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=TIMEOUT_S, env={**os.environ, **(env or {})})


def one_line_error(result: subprocess.CompletedProcess, text: str, status: int = 1) -> None:
    """A user error: exit 1 (2 for a bad command line), nothing on stdout, one line on stderr naming the
    problem, no traceback."""
    assert result.returncode == status, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert text in result.stderr, result.stderr


@pytest.fixture
def held(tmp_path: Path):
    """A lease held (by this test process) on import:daily in table locks of tmp_path/locks.db."""
    client = SQLiteClient(tmp_path / "locks.db")
    guard = SyncDistributedLock(client, table="locks", key="import:daily")
    lease = guard.__enter__()
    yield lease
    try:
        guard.__exit__(None, None, None)
    except LockLost:
        pass  # a test removed the row with --force
    client.close()


def test_status_and_list_show_the_holder(tmp_path, held):
    status = fastlease("status", "import:daily", "--table", "locks", "--path", "locks.db", cwd=tmp_path)
    assert status.returncode == 0 and status.stderr == ""
    assert status.stdout.startswith(f"import:daily: held by {held.owner}, lease 30 s, protocol 1, fencing token 1")
    data = json.loads(fastlease("status", "import:daily", "--table", "locks", "--path", "locks.db", "--json",
                                cwd=tmp_path).stdout)
    assert (data["held"], data["owner"], data["lease_ms"], data["protocol"], data["fence"]) == (
        True, held.owner, 30_000, 1, 1)
    assert data["seen_unchanged_s"] >= 0
    free = fastlease("status", "other", "--table", "locks", "--path", "locks.db", "--json", cwd=tmp_path)
    assert json.loads(free.stdout) == {"key": "other", "held": False}
    listed = json.loads(fastlease("list", "--table", "locks", "--path", "locks.db", "--json", cwd=tmp_path).stdout)
    assert [(row["key"], row["owner"]) for row in listed] == [("import:daily", held.owner)]
    assert fastlease("list", "--table", "empty", "--path", "locks.db", cwd=tmp_path).stdout == (
        "no held keys in 'empty'\n")


def test_status_shows_an_elections_leader_and_term(tmp_path):
    from fastlease.election import Election

    client = SQLiteClient(tmp_path / "locks.db")
    try:
        with Election(client, table="leaders", key="scheduler", identity="worker-3").campaign() as term:
            status = fastlease("status", "scheduler", "--table", "leaders", "--path", "locks.db", cwd=tmp_path)
    finally:
        client.close()
    assert status.returncode == 0 and status.stdout.startswith(f"scheduler: held by {term.owner}, ")
    assert f"fencing token {term.number}, leader 'worker-3' in term {term.number}" in status.stdout


def test_holders_shows_who_holds_which_slot_of_a_semaphore(tmp_path):
    from fastlease import Semaphore

    client = SQLiteClient(tmp_path / "locks.db")
    try:
        with Semaphore(client, table="locks", key="gpu", limit=3, identity="node-a") as first, \
                Semaphore(client, table="locks", key="gpu", limit=3, identity="node-b") as second:
            shown = fastlease("holders", "gpu", "--table", "locks", "--path", "locks.db", cwd=tmp_path)
            data = json.loads(fastlease("holders", "gpu", "--table", "locks", "--path", "locks.db", "--json",
                                        cwd=tmp_path).stdout)
        free = fastlease("holders", "gpu", "--table", "locks", "--path", "locks.db", "--limit", "3", cwd=tmp_path)
        bad = fastlease("holders", "gpu", "--table", "locks", "--path", "locks.db", "--limit", "0", cwd=tmp_path)
    finally:
        client.close()
    assert shown.returncode == 0 and shown.stdout.splitlines() == [
        f"slot 0: gpu: held by {first.owner}, lease 30 s, protocol 1, fencing token 1, "
        "a slot of a semaphore of limit 3, held by 'node-a'",
        f"slot 1: gpu#slot1: held by {second.owner}, lease 30 s, protocol 1, fencing token 1, "
        "a slot of a semaphore of limit 3, held by 'node-b'"]
    assert [(row["slot"], row["identity"], row["limit"]) for row in data] == [(0, "node-a", 3), (1, "node-b", 3)]
    assert free.returncode == 0 and free.stdout == "gpu: no slot held\n"
    one_line_error(bad, "argument --limit: limit must be between 1 and 256 holders, got 0", status=2)


def test_release_needs_force_and_removes_only_the_row_printed(tmp_path, held):
    refused = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", cwd=tmp_path)
    one_line_error(refused, f"would remove import:daily: held by {held.owner}")
    assert "--force" in refused.stderr
    assert held.is_valid()
    assert SQLiteClient(tmp_path / "locks.db").inspect("locks", "import:daily")[0]["owner"] == held.owner
    forced = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", "--force", "--json",
                       cwd=tmp_path)
    assert forced.returncode == 0
    assert json.loads(forced.stdout)["removed"] is True
    assert SQLiteClient(tmp_path / "locks.db").inspect("locks") == []
    again = fastlease("release", "import:daily", "--table", "locks", "--path", "locks.db", "--force", cwd=tmp_path)
    assert again.returncode == 0 and "not held, nothing to remove" in again.stdout


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    one_line_error(fastlease("status", "k", "--table", "locks", "--path", "missing.db", cwd=tmp_path),
                   "no SQLite lock file at 'missing.db'")
    (tmp_path / "corrupt.db").write_bytes(b"not a database, only text " * 300)
    one_line_error(fastlease("list", "--table", "locks", "--path", "corrupt.db", cwd=tmp_path), "is unusable")
    one_line_error(fastlease("list", "--table", "locks", "--store", "nope", cwd=tmp_path), "unknown store 'nope'", 2)
    one_line_error(fastlease("demo", "--store", "nope", cwd=tmp_path), "unknown store 'nope'", 2)
    one_line_error(fastlease("status", "k", "--table", "locks", "--store", "redis", "--url",
                             "redis://:pw-secret@127.0.0.1:1/0", cwd=tmp_path), "127.0.0.1:1/0")
    one_line_error(fastlease("list", "--table", "locks", "--store", "redis", "--url", "http://x", cwd=tmp_path),
                   "bad Redis URL", 2)
    one_line_error(fastlease("list", "--table", "locks", "--store", "redis", "--url", "http://x", cwd=tmp_path),
                   "a Redis Cluster takes redis+cluster://host:port", 2)
    one_line_error(fastlease("demo", "--path", str(tmp_path / "no-dir" / "x.db"), cwd=tmp_path), "does not exist")
    one_line_error(fastlease("demo", "--workers", "1", cwd=tmp_path), "--workers must be an integer from 2 to 64", 2)
    one_line_error(fastlease("demo", "--seconds", "1", cwd=tmp_path), "--seconds must be from 2 to 600", 2)
    one_line_error(fastlease("list", "--table", "locks", "--path", "/nonexistent/dir/x.db", cwd=tmp_path),
                   "no SQLite lock file at '/nonexistent/dir/x.db' (its directory '/nonexistent/dir' does not exist")
    given = fastlease("list", "--table", "locks", "--path", "never.db", cwd=tmp_path)
    one_line_error(given, "no lease has used that file yet, or the path is wrong")
    assert "pass --path" not in given.stderr  # it was passed
    one_line_error(fastlease("list", "--table", "locks", cwd=tmp_path), "pass --path with the file")
    usage = fastlease("status", cwd=tmp_path)  # a bad command line: argparse's usage message, exit 2
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


# ---- keys and tables: the library's own rules ----------------------------------------------------------
LONG_KEY = "k" * 3000


@pytest.mark.parametrize("argv, argument, rule", [
    (["status", "", "--table", "locks"], "KEY", ("check_key", "")),
    (["status", LONG_KEY, "--table", "locks"], "KEY", ("check_key", LONG_KEY)),
    (["status", "k", "--table", "ab"], "--table", ("check_table", "ab")),
    (["release", "", "--table", "locks", "--force"], "KEY", ("check_key", "")),
    (["release", LONG_KEY, "--table", "locks", "--force"], "KEY", ("check_key", LONG_KEY)),
    (["release", "k", "--table", "a:b", "--force"], "--table", ("check_table", "a:b")),
    (["list", "--table", "bad name"], "--table", ("check_table", "bad name")),
    (["create-table", "ab"], "NAME", ("check_table", "ab")),
], ids=["status-empty-key", "status-long-key", "status-table", "release-empty-key", "release-long-key",
        "release-table", "list-table", "create-table-name"])
def test_a_key_or_table_the_library_refuses_is_a_bad_command_line(tmp_path, monkeypatch, capsys, argv, argument,
                                                                    rule):
    """Checked with the engine's own rules before any store is reached: the working directory has no
    ./fastlease.db, so a store request would fail with another message (and exit 1)."""
    monkeypatch.chdir(tmp_path)
    check, value = rule
    with pytest.raises(ValueError) as refused:
        {"check_key": _impl.core.check_key, "check_table": check_table}[check](value)  # where each rule lives
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err == f"fastlease {argv[0]}: error: argument {argument}: {refused.value}\n"
    assert list(tmp_path.iterdir()) == []  # no lock file was made or opened


def test_fastlease_status_of_an_empty_key_exits_2_with_one_line(tmp_path):
    SQLiteClient(tmp_path / "fastlease.db").close()  # the store exists: only the key is wrong
    result = fastlease("status", "", "--table", "locks", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "fastlease status: error: argument KEY: lock key must be 1-2048 UTF-8 bytes, got 0: ''\n"


# ---- an unreachable store ---------------------------------------------------------------------------------
@pytest.fixture
def free_port() -> int:
    """A 127.0.0.1 port nobody listens on: bound by the OS, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("store, name, option, address, cause", [
    ("redis", "Redis", "--url", "redis://127.0.0.1:{port}/0",
     "ConnectionError: Error 111 connecting to 127.0.0.1:{port}. Connection refused."),
    ("dynamodb", "DynamoDB", "--endpoint-url", "http://127.0.0.1:{port}",
     'EndpointConnectionError: Could not connect to the endpoint URL: "http://127.0.0.1:{port}/"'),
    ("postgres", "PostgreSQL", "--dsn", "postgresql://postgres@127.0.0.1:{port}/postgres",
     'could not connect to 127.0.0.1:{port}/postgres: connection failed: connection to server at "127.0.0.1", '
     'port {port} failed: Connection refused'),
], ids=["redis", "dynamodb", "postgres"])
def test_demo_on_an_unreachable_store_is_one_line_before_any_worker_starts(tmp_path, free_port, store, name, option,
                                                                            address, cause):
    """Nothing is printed before the line (no worker started), and it names the store, the address and
    the error."""
    address, cause = address.format(port=free_port), cause.format(port=free_port)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for output in ([], ["--json"]):
        result = fastlease("demo", "--store", store, option, address, *output, cwd=tmp_path, env=env)
        one_line_error(result, f"fastlease demo: error: cannot reach the store ({name} at {address}): ")
        assert cause in result.stderr


@pytest.mark.parametrize("store, option, address, shown", [
    ("redis", "--url", "redis://:pw-secret@127.0.0.1:{port}/0", "(Redis at redis://:***@127.0.0.1:{port}/0)"),
    ("postgres", "--dsn", "postgresql://postgres:pw-secret@127.0.0.1:{port}/postgres",
     "(PostgreSQL at postgresql://postgres:***@127.0.0.1:{port}/postgres)"),
], ids=["redis", "postgres"])
def test_demo_hides_the_password_of_a_store_address(tmp_path, free_port, store, option, address, shown):
    result = fastlease("demo", "--store", store, option, address.format(port=free_port), cwd=tmp_path)
    one_line_error(result, shown.format(port=free_port))
    assert "pw-secret" not in result.stderr


@pytest.mark.parametrize("store, option, address, server", [
    ("redis", "--url", "redis://127.0.0.1:{port}/0", "127.0.0.1:{port}"),
    ("postgres", "--dsn", "postgresql://postgres@127.0.0.1:{port}/postgres", "127.0.0.1:{port}/postgres"),
], ids=["redis", "postgres"])
@pytest.mark.parametrize("command", [["status", "k"], ["list"], ["release", "k", "--force"]],
                         ids=["status", "list", "release"])
def test_an_unreachable_store_is_one_line_naming_the_server(tmp_path, free_port, store, option, address, server,
                                                            command):
    result = fastlease(*command, "--table", "locks", "--store", store, option, address.format(port=free_port),
                       cwd=tmp_path)
    one_line_error(result, server.format(port=free_port))
    assert "Connection refused" in result.stderr


def test_workers_whose_store_fails_never_acquire_and_are_not_ok(free_port):
    """A store that goes away after the check: every wait ends on store errors. Each worker is then
    'never acquired', and the errors (which make the command exit 1) say why."""
    lines: list[str] = []
    summary = demo._contend(StoreOptions("redis", url=f"redis://127.0.0.1:{free_port}/0"), 2, 2.0, lines.append)
    assert [row["status"] for row in summary["workers"]] == ["never acquired", "never acquired"]
    assert all(row["acquisitions"] == 0 and row["timeouts"] >= 1 for row in summary["workers"])
    assert len(summary["errors"]) == 2
    for index, error in enumerate(summary["errors"]):
        assert error.startswith(f"worker {index} never acquired a lease: the store failed its requests (last error: ")
        assert "Connection refused" in error
    assert f"error: {summary['errors'][0]}" in lines


def test_a_worker_whose_lease_lapses_reports_the_loss_and_goes_on(monkeypatch):
    """Leaving a block after a lapse raises LockLost: the demo reports it and carries on, since a
    starved machine can do that to a 1 s lease; it is not an error of the demo."""
    import multiprocessing
    import queue

    from fastlease.testing import FaultInjector

    store = MemoryStore()
    store.faults = faults = FaultInjector()
    faults.add("update_version_if", "unavailable", times=-1)  # no renewal lands: the lease lapses
    monkeypatch.setattr(demo, "WORK_S", (1.0, 1.0))  # longer than the lease's validity (0.9 s)
    events: queue.Queue = queue.Queue()
    stop_at = multiprocessing.Value("d", time.monotonic() + 0.5, lock=False)  # the shared deadline
    demo.worker(0, StoreOptions("memory"), store, stop_at, events)
    kinds = []
    while not events.empty():
        kinds.append(events.get_nowait())
    kinds = [event for event in kinds if event[0] != "valid"]  # the validity reports while it works
    assert [event[0] for event in kinds] == ["hold", "lost", "done"]
    assert kinds[1][3] == "unreachable"
    lines = printed_summary({**SUMMARY, "workers": [{**SUMMARY["workers"][0], "lost": 1}]})
    assert "1 lease(s) lost before the work ended: renewals did not keep up (an overloaded machine?)" in lines


def test_a_worker_that_lost_every_turn_is_never_acquired_but_no_error():
    """Many workers in a short run: losing every turn to the others is contention, not a failure."""
    stats = [{"acquisitions": count, "status": status} for count, status in [(3, "ok"), (0, "ok"), (2, "killed")]]
    assert demo._never_acquired(stats, {}, 2.0) == []
    assert [row["status"] for row in stats] == ["ok", "never acquired", "killed"]
    nobody = [{"acquisitions": 0, "status": "ok"} for _ in range(2)]
    assert demo._never_acquired(nobody, {}, 2.0) == ["no worker acquired a lease in 2 s"]


# ---- the summary ---------------------------------------------------------------------------------------
SUMMARY = {
    "store": "sqlite", "errors": [],
    "workers": [{"acquisitions": 9, "contended": 4, "wait_ms": 812.4, "renewals": 6, "timeouts": 0, "status": "ok"},
                {"acquisitions": 5, "contended": 2, "wait_ms": 90.0, "renewals": 3, "timeouts": 1, "status": "killed"}],
    "killed": {"worker": 1, "customer": "acme", "at": 12.0, "takeover_s": 0.74, "taken_by": 0,
               "valid_after_kill_s": 0.52},
}


def printed_summary(summary: dict) -> list[str]:
    lines: list[str] = []
    demo._print_table(summary, lines.append)
    return lines


LEGEND_LINE = re.compile(r"^  (\S+(?: \S+)?) {2,}(\S.*)$")  # "  wait ms       time spent ..."


def test_the_summary_explains_every_column_under_the_table():
    lines = printed_summary(SUMMARY)
    columns = ["acquisitions", "contended", "wait ms", "renewals", "timeouts", "status"]
    assert re.split(r" {2,}", lines[1]) == ["worker", *columns]
    assert lines[2:4] == ["     0             9          4      812         6         0  ok",
                          "     1             5          2       90         3         1  killed"]
    legend = dict(LEGEND_LINE.match(line).groups() for line in lines[4:4 + len(columns)])
    assert list(legend) == columns
    assert legend["contended"] == "of those, acquisitions that found the key held and waited for it"
    assert legend["wait ms"] == "time spent waiting for the lease, summed over the worker's acquisitions"
    assert legend["timeouts"] == "attempts that gave up after waiting 3 s without getting the lease"
    assert "never acquired (no lease in the whole run)" in legend["status"]


def test_the_takeover_line_says_from_when_it_was_counted():
    lines = printed_summary(SUMMARY)
    start = lines.index("takeover: worker 0 took acme over 0.74 s after worker 1 was killed,")
    assert lines[start + 1:] == [
        "  one lease (1 s) after its last renewal, which came before the kill: a holder renews every 0.33 s, so a "
        "takeover can come 0.67 s after the kill, or sooner when its renewals ran late",
        "  the killed holder's lease was valid until +0.52 s from the kill (its last report), and the takeover came "
        "after that",
    ]


def test_fastlease_version(tmp_path):
    result = fastlease("--version", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"fastlease {fastlease_package.__version__}\n"
    assert importlib.metadata.version("fastlease") == fastlease_package.__version__


def parsers(parser: argparse.ArgumentParser, name: str):
    """``parser`` and every subcommand's parser below it, with their command names."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, subparser in action.choices.items():
                yield from parsers(subparser, f"{name} {command}")


def test_every_option_and_command_has_a_help_text():
    missing = []
    for name, parser in parsers(cli._parser(), "fastlease"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                actions = action._choices_actions  # one per subcommand: its help in the list of commands
            else:
                actions = [action]
            for each in actions:
                if not each.help or each.help == argparse.SUPPRESS:
                    missing.append(f"{name} {'/'.join(each.option_strings) or each.metavar or each.dest}")
    assert missing == []
    assert len(list(parsers(cli._parser(), "fastlease"))) == 1 + len(cli.COMMANDS)


# ---- make demo --------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (Path(__file__).resolve().parent.parent / "Makefile").exists(),
                    reason="no Makefile here: the suite runs against an installed wheel")
def test_make_demo_says_what_it_does_before_the_silent_setup(tmp_path):
    """``make -n`` with a venv that does not exist yet: the commands a first ``make demo`` runs, in order."""
    root = Path(__file__).resolve().parent.parent
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}
    result = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(root), "demo",
                             f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True, timeout=60, env=env,
                            check=True)
    commands = result.stdout.splitlines()
    setup = [index for index, command in enumerate(commands) if " -m venv " in command or " -m pip " in command]
    assert setup and commands[-1].endswith("fastlease demo"), commands
    first = commands[0]
    assert first.startswith("echo ") and "first run" in first and setup[0] == 1, commands
    install = next(index for index, command in enumerate(commands) if "pip install -q -e ." in command)
    assert commands[install - 1].startswith("echo ") and "about a minute" in commands[install - 1], commands


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_demo_on_sqlite_shows_a_takeover_of_the_killed_holder(tmp_path):
    # 6 s, so 3 s after the kill at halftime: the takeover takes 0.9-1.1 s on a quiet machine, but one
    # clean-clone CI run's 4 s demo ended before any (2 s after the kill), so the margin was too thin.
    result = fastlease("demo", "--workers", "3", "--seconds", "6", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["store"] == "sqlite" and summary["errors"] == []
    assert all(row["acquisitions"] > 0 for row in summary["workers"])
    killed = summary["killed"]
    assert summary["workers"][killed["worker"]]["status"] == "killed"
    assert killed.get("taken_by", killed["worker"]) != killed["worker"], (result.stdout, result.stderr)
    # Another worker waited out the dead holder's lease (1 s), counted from its first sighting of the last
    # renewal, which precedes the kill by a renewal interval (1/3 s) or more when renewals ran late: the
    # bound that always holds is the dead holder's own validity, as it last reported it.
    assert 0 < killed["takeover_s"] < 5.0, killed
    assert killed["takeover_s"] > killed["valid_after_kill_s"], killed
    assert list(tmp_path.iterdir()) == []  # the temporary lock file is gone


def test_a_kill_that_comes_after_the_planned_end_is_still_taken_over(monkeypatch):
    """A loaded machine starts the workers late, so the halfway kill can find no holder until after the
    run's planned end. The workers must still be there to take the killed holder's key over (one CI run
    ended with the kill and no takeover)."""
    kill = demo._kill_a_holder
    planned_end = []

    def late_kill(holders, runners, crashes, now, start_at, say):
        planned_end[:] = [start_at + 2.0]  # the run's start plus its seconds, below
        if now < planned_end[0] + 0.3:
            return None  # as if nobody had held a lease yet
        return kill(holders, runners, crashes, now, start_at, say)

    monkeypatch.setattr(demo, "_kill_a_holder", late_kill)
    summary = demo.run(StoreOptions("memory"), workers=3, seconds=2.0, say=lambda line: None)
    killed = summary["killed"]
    assert killed is not None and killed["at"] > planned_end[0], killed
    assert killed["taken_by"] != killed["worker"], killed


def _send_forever(channel, payload):
    channel.put(("big", payload))  # blocks: the pipe holds 64 KiB and nobody reads until the kill


@pytest.mark.posix  # SIGKILL
def test_a_worker_killed_in_the_middle_of_a_send_silences_only_itself():
    """The demo kills a worker; with one shared multiprocessing.Queue, a kill while that worker's feeder
    held the writers' lock silenced every worker. Each worker has its own pipe now: the half-sent event
    ends that pipe, and the other worker's events still come."""
    import multiprocessing.connection
    import signal

    context = multiprocessing.get_context("fork")  # the target lives in this test module
    (dying_reader, dying_writer), (live_reader, live_writer) = (context.Pipe(duplex=False) for _ in range(2))
    dying = context.Process(target=_send_forever, args=(demo._Channel(dying_writer), b"x" * 10_000_000))
    dying.start()
    try:
        dying_writer.close()
        assert multiprocessing.connection.wait([dying_reader], 30.0) == [dying_reader]  # the send has begun
        os.kill(dying.pid, signal.SIGKILL)
        dying.join(30.0)
        demo._Channel(live_writer).put(("hold", 1))
        inbox = demo._Inbox([dying_reader, live_reader])
        events = [inbox.get(0.5) for _ in range(3)]  # bounded: the dead pipe ends, the live one answers
        assert ("hold", 1) in events and ("big", b"x" * 10_000_000) not in events, events
        assert inbox._readers == [live_reader]
    finally:
        if dying.is_alive():
            os.kill(dying.pid, signal.SIGKILL)
            dying.join(30.0)


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.server),
                        pytest.param("postgres", marks=pytest.mark.server)])
def served(request):
    """A store on a server of the test session, emptied: (its name, the store options that reach it, a
    client of it). The Postgres one has the lock table ``locks`` (lock operations never make tables)."""
    if request.param == "redis":
        from fastlease.redis import RedisClient

        request.getfixturevalue("redis_db")  # empties the database
        url = request.getfixturevalue("redis_url")
        client = RedisClient(url)
        options = ["--store", "redis", "--url", url]
    else:
        from fastlease.postgres import PostgresClient

        dsn = request.getfixturevalue("postgres_db")
        client = PostgresClient(dsn)
        client.create_lock_table("locks")
        options = ["--store", "postgres", "--dsn", dsn]
    yield request.param, options, client
    client.close()


#: How soon after the kill the killed holder's key is taken over, by store. Redis: the key expires at
#: most one lease (1 s) after the last renewal, itself at most a renewal interval (1/3 s) before the kill,
#: and the next poll finds it gone. PostgreSQL: a contender waits out one lease of unchanged sightings,
#: counted from its first sighting of the last renewal; on this shared 2-core machine, 5 s as for SQLite.
TAKEOVER_BOUND_S = {"redis": 3.0, "postgres": 5.0}


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_demo_on_a_server_shows_the_killed_holders_key_recovered(tmp_path, request, served):
    store, options, client = served
    # 6 s, as on SQLite: a 4 s demo can end 2 s after the kill, before anyone asked for the key again.
    result = fastlease("demo", *options, "--workers", "3", "--seconds", "6", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["store"] == store and summary["errors"] == []
    assert all(row["acquisitions"] > 0 for row in summary["workers"])
    killed = summary["killed"]
    assert summary["workers"][killed["worker"]]["status"] == "killed" and killed["taken_by"] != killed["worker"]
    assert 0 < killed["takeover_s"] < TAKEOVER_BOUND_S[store], killed
    assert killed["takeover_s"] > killed["valid_after_kill_s"], killed  # never within the dead holder's validity
    assert client.inspect(demo.TABLE) == []  # the key taken over was released too: nothing is left held
    if store == "redis":
        assert request.getfixturevalue("redis_db").keys(b"fastlease:demo_locks:lease:*") == []


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_demo_on_postgres_without_a_dsn_starts_and_stops_a_throwaway_server(tmp_path, monkeypatch):
    monkeypatch.delenv("FASTLEASE_POSTGRES_DSN", raising=False)
    result = fastlease("demo", "--store", "postgres", "--workers", "2", "--seconds", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    said = re.fullmatch(r"store: PostgreSQL on a throwaway local server \(no --dsn given\), "
                        r"(postgresql://postgres@127\.0\.0\.1:\d+/postgres) \(pid (\d+)\), removed at the end", first)
    assert said, first
    assert "worker  acquisitions  contended" in result.stdout
    with pytest.raises(ProcessLookupError):  # the postmaster is gone (reaped by the demo's server guard)
        os.kill(int(said.group(2)), 0)
    import psycopg

    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(said.group(1), connect_timeout=5).close()


def test_demo_on_postgres_without_initdb_says_so_and_how_to_fix_it(tmp_path):
    """No PostgreSQL to run (an empty $PG_BINDIR, which alone is then searched, and a PATH without
    initdb): one line saying so, how to install it and that --dsn is the other way; no traceback."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "FASTLEASE_POSTGRES_DSN"}
    result = subprocess.run([sys.executable, "-m", "fastlease", "demo", "--store", "postgres"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=TIMEOUT_S,
                            env={**env, "PG_BINDIR": str(empty), "PATH": str(empty)})
    one_line_error(result, "fastlease demo: error: --store postgres without --dsn (or $FASTLEASE_POSTGRES_DSN) "
                           "starts a throwaway local PostgreSQL server, but initdb is not available")
    assert "apt-get install -y postgresql" in result.stderr and "pass --dsn" in result.stderr


def test_status_list_and_release_on_a_server(tmp_path, served):
    store, options, client = served
    guard = SyncDistributedLock(client, table="locks", key="import:daily")
    lease = guard.__enter__()
    status = fastlease("status", "import:daily", "--table", "locks", *options, cwd=tmp_path)
    assert status.stdout.startswith(f"import:daily: held by {lease.owner}, lease 30 s, protocol 1, fencing token 1")
    listed = json.loads(fastlease("list", "--table", "locks", "--json", *options, cwd=tmp_path).stdout)
    assert [(row["key"], row["owner"]) for row in listed] == [("import:daily", lease.owner)]
    forced = fastlease("release", "import:daily", "--table", "locks", "--force", *options, cwd=tmp_path)
    assert forced.returncode == 0 and "removed import:daily" in forced.stdout
    assert client.inspect("locks") == []
    with pytest.raises(LockLost):
        guard.__exit__(None, None, None)


# ---- PostgreSQL: the DSN and create-table ---------------------------------------------------------------
@pytest.mark.server
def test_a_cluster_url_on_a_single_server_names_the_url_to_give_instead(tmp_path, redis_url):
    address = redis_url.split("//", 1)[1].split("/", 1)[0]
    refused = fastlease("list", "--table", "locks", "--store", "redis", "--url", f"redis+cluster://{address}",
                        cwd=tmp_path)
    one_line_error(refused, f"the Redis server at {address} is not a Redis Cluster node")
    assert f"give it the URL redis://{address}/0, not a redis+cluster:// URL" in refused.stderr
    assert "RedisClient(" not in refused.stderr  # advice a command line can follow


def test_create_table_on_postgres_makes_the_lock_table_and_a_rerun_does_nothing(tmp_path, postgres_db):
    from fastlease.postgres import PostgresClient

    dsn = ["--store", "postgres", "--dsn", postgres_db]
    created = fastlease("create-table", "jobs", *dsn, "--json", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"created": "jobs"}
    client = PostgresClient(postgres_db)
    try:
        with SyncDistributedLock(client, table="jobs", key="job") as lease:
            again = fastlease("create-table", "jobs", "--store", "postgres", cwd=tmp_path,
                              env={"FASTLEASE_POSTGRES_DSN": postgres_db})  # --dsn's default
            assert again.returncode == 0, again.stderr
            assert again.stdout.startswith("lock table 'jobs' already exists on 127.0.0.1:")
            assert again.stdout.endswith(" with fastlease's columns; nothing to do\n")
            assert client.inspect("jobs")[0]["owner"] == lease.owner  # the rerun left the held row alone
        import psycopg

        with psycopg.connect(postgres_db, autocommit=True) as connection:
            connection.execute('CREATE TABLE "other" (key text PRIMARY KEY)')
        one_line_error(fastlease("create-table", "other", *dsn, cwd=tmp_path),
                       "PostgreSQL table 'other' exists with other columns than a fastlease lock table")
    finally:
        client.close()


def test_create_table_stays_dynamodb_by_default_and_makes_no_other_stores_tables(tmp_path):
    parsed = cli._parser().parse_args(["create-table", "locks"])
    assert cli.store_options(parsed).store == "dynamodb"
    for store, text in (("sqlite", "SQLite needs no lock table made"), ("redis", "Redis needs no lock table made")):
        said = fastlease("create-table", "locks", "--store", store, cwd=tmp_path)
        assert (said.returncode, said.stderr) == (0, ""), said
        assert said.stdout.startswith(text) and said.stdout.endswith("; nothing to do\n"), said.stdout
    assert list(tmp_path.iterdir()) == []  # no file, no server reached
    one_line_error(fastlease("create-table", "locks", "--store", "nosuch", cwd=tmp_path), "unknown store 'nosuch'", 2)


def test_a_postgres_table_name_longer_than_it_keeps_is_a_bad_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "t" * 77
    for argv in (["create-table", name], ["list", "--table", name], ["status", "k", "--table", name]):
        assert cli.main([*argv, "--store", "postgres", "--dsn", "postgresql://app@127.0.0.1:1/app"]) == 2
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and "at most 63 characters" in captured.err, captured


@pytest.mark.parametrize("argv", [["status", "k", "--table", "locks"], ["list", "--table", "locks"],
                                  ["release", "k", "--table", "locks", "--force"], ["create-table", "locks"]],
                         ids=["status", "list", "release", "create-table"])
def test_postgres_without_a_dsn_says_what_to_pass(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FASTLEASE_POSTGRES_DSN", raising=False)
    assert error_of(capsys, *argv, "--store", "postgres") == (
        "--store postgres needs a server: pass --dsn postgresql://USER@HOST:5432/DBNAME or set "
        "$FASTLEASE_POSTGRES_DSN\n")


@pytest.mark.parametrize("dsn, problem", [
    ("nonsense", 'missing "=" after "nonsense" in connection info string'),
    ("postgresql://app:pw-secret@127.0.0.1:port/app", "port 'port' is not a number from 1 to 65535"),
    ("host=127.0.0.1 port=70000 password=pw-secret", "port '70000' is not a number from 1 to 65535"),
    ("postgresql://app:pw-secret@db/app?nosuch=1", 'invalid URI query parameter: "nosuch"'),
], ids=["not-a-dsn", "uri-port", "keyword-port", "uri-parameter"])
def test_a_bad_postgres_dsn_is_a_bad_command_line_with_one_line(tmp_path, monkeypatch, capsys, dsn, problem):
    """Exit 2, as for a bad key, from --dsn or $FASTLEASE_POSTGRES_DSN, alike in every command and before
    anything is reached (the demo starts no server); any password hidden."""
    monkeypatch.chdir(tmp_path)
    for argv in (["status", "k", "--table", "locks"], ["list", "--table", "locks"],
                 ["release", "k", "--table", "locks", "--force"], ["create-table", "locks"], ["demo"]):
        for source, options in (("--dsn", ["--dsn", dsn]), ("$FASTLEASE_POSTGRES_DSN", [])):
            if options:
                monkeypatch.delenv("FASTLEASE_POSTGRES_DSN", raising=False)
            else:
                monkeypatch.setenv("FASTLEASE_POSTGRES_DSN", dsn)
            assert cli.main([*argv, "--store", "postgres", *options]) == 2
            captured = capsys.readouterr()
            assert captured.out == "" and captured.err.count("\n") == 1, captured
            assert captured.err.startswith(f"fastlease {argv[0]}: error: bad PostgreSQL connection string '"), captured
            assert f"' ({source}): {problem}; pass a URI like postgresql://USER@HOST:5432/DBNAME" in captured.err
            assert "pw-secret" not in captured.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.posix  # the demo SIGKILLs a worker
def test_text_demo_prints_progress_and_the_table(tmp_path):
    result = fastlease("demo", "--store", "memory", "--workers", "2", "--seconds", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "acquisitions ·" in result.stdout  # progress lines
    assert "worker  acquisitions  contended" in result.stdout
    assert "  contended     of those, acquisitions that found the key held and waited for it\n" in result.stdout
    assert "takeover: worker" in result.stdout
    assert "  one lease (1 s) after its last renewal, which came before the kill: a holder renews" in result.stdout
    assert " s after worker " in result.stdout and "was killed, one lease (1 s) after its last renewal" in result.stdout


def test_create_table_status_and_list_on_dynamodb(tmp_path, moto_endpoint, moto_session):
    from fastlease.dynamodb import DynamoDBClient

    table = f"cli-{uuid.uuid4().hex[:8]}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    endpoint = ["--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    created = fastlease("create-table", table, *endpoint, "--json", cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"created": table}
    again = fastlease("create-table", table, *endpoint, cwd=tmp_path, env=env)  # a rerun: fine, as on PostgreSQL
    assert (again.returncode, again.stdout) == (
        0, f"lock table {table!r} already exists with fastlease's key schema; nothing to do\n"), again
    client = DynamoDBClient(session=moto_session, endpoint_url=moto_endpoint)
    try:
        with SyncDistributedLock(client, table=table, key="job") as lease:
            status = fastlease("status", "job", "--table", table, "--store", "dynamodb", *endpoint, "--json",
                               cwd=tmp_path, env=env)
            assert status.returncode == 0, status.stderr
            row = json.loads(status.stdout)
            assert (row["owner"], row["lease_ms"], row["protocol"], row["fence"]) == (lease.owner, 30_000, 1, None)
            listed = fastlease("list", "--table", table, "--store", "dynamodb", *endpoint, cwd=tmp_path, env=env)
            assert listed.stdout.startswith(f"job: held by {lease.owner}, lease 30 s, protocol 1")
    finally:
        client.close()


@pytest.mark.parametrize("store", [pytest.param("postgres", marks=pytest.mark.server),
                                   pytest.param("dynamodb", marks=pytest.mark.server)])
def test_operator_commands_on_a_missing_table_name_it_and_how_to_create_it(tmp_path, request, store):
    if store == "postgres":
        options, env, named = ["--store", "postgres", "--dsn", request.getfixturevalue("postgres_db")], {}, '"nosuch"'
    else:
        options = ["--store", "dynamodb", "--endpoint-url", request.getfixturevalue("moto_endpoint"),
                   "--region", "us-east-1"]
        env, named = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}, "'nosuch'"
    for argv in (["status", "job", "--table", "nosuch"], ["list", "--table", "nosuch"],
                 ["release", "job", "--table", "nosuch", "--force"]):
        result = fastlease(*argv, *options, cwd=tmp_path, env=env)
        one_line_error(result, named)
        assert "does not exist" in result.stderr and "create_lock_table" in result.stderr, result.stderr


def test_dynamodb_without_a_region_says_to_pass_region(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if name not in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "config"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"))
    result = subprocess.run([sys.executable, "-m", "fastlease", "list", "--table", "locks", "--store", "dynamodb"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT_S, env=env)
    one_line_error(result, "--store dynamodb needs an AWS Region and none is configured: pass --region")
    assert "region_name" not in result.stderr


def test_a_read_only_lock_file_is_one_line_error(tmp_path, read_only_file):
    one_line_error(fastlease("list", "--table", "locks", "--path", str(read_only_file), cwd=tmp_path), "ro.db")


# ---- one store factory for the command and the demo -------------------------------------------------
CLIENT_CLASSES = re.compile(r"\b(SQLite|DynamoDB|Redis|Postgres|Memory)Client\(")


def test_the_command_and_the_demo_build_no_client_of_their_own():
    """A second way to build a client could give an option another meaning: there is only the factory."""
    for module in (cli, demo):
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert not CLIENT_CLASSES.findall(source), f"{module.__name__} builds a client itself; use client_from_options"


def error_of(capsys, *argv: str, status: int = 1) -> str:
    """Run the command in this process; return its one-line error without the command's prefix."""
    assert cli.main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    prefix = f"fastlease {argv[0]}: error: "
    assert captured.err.startswith(prefix), captured.err
    return captured.err[len(prefix):]


@pytest.mark.parametrize("options, expected", [
    (["--store", "nope"], "unknown store 'nope'; pass --store sqlite, dynamodb, redis, postgres or memory"),
    (["--store", "redis", "--url", "http://x"], "bad Redis URL 'http://x'"),
    (["--store", "redis", "--url", "redis://127.0.0.1:port/0"], "bad Redis URL"),
], ids=["unknown-store", "redis-scheme", "redis-port"])
def test_the_command_and_the_demo_reject_a_bad_option_with_one_message(tmp_path, monkeypatch, capsys, options,
                                                                       expected):
    monkeypatch.chdir(tmp_path)
    listed = error_of(capsys, "list", "--table", demo.TABLE, *options, status=2)  # a bad command line
    assert expected in listed
    assert error_of(capsys, "demo", *options, status=2) == listed


@pytest.mark.parametrize("store, library, extra", [("dynamodb", "boto3", "dynamodb"), ("redis", "redis", "redis"),
                                                   ("postgres", "psycopg", "postgres")])
def test_a_missing_client_library_is_named_alike_with_its_install(tmp_path, monkeypatch, capsys, store, library,
                                                                  extra):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, library, None)  # as if not installed: importing it raises ImportError
    message = error_of(capsys, "list", "--table", "locks", "--store", store)
    assert message == error_of(capsys, "demo", "--store", store)  # before the demo starts any server
    assert f"--store {store} needs " in message and f"pip install 'fastlease[{extra}]'" in message
    if store == "dynamodb":
        assert error_of(capsys, "create-table", "locks") == message
    if store == "postgres":
        assert error_of(capsys, "create-table", "locks", "--store", "postgres") == message


def both_ways(argv: list[str], said: list[str] | None = None) -> tuple[StoreOptions, StoreOptions]:
    """The options ``list`` uses, and those ``demo`` hands its workers, for the same store options (what
    the demo says about its store is appended to ``said``)."""
    command = cli.store_options(cli._parser().parse_args(["list", "--table", demo.TABLE, *argv]))
    cleanup: list = []
    try:
        prepared = demo.prepare_store(cli.store_options(cli._parser().parse_args(["demo", *argv])), cleanup,
                                      say=(said if said is not None else []).append)
    finally:
        for step in reversed(cleanup):
            step()
    return command, prepared


def assert_same_client(command: StoreOptions, prepared: StoreOptions, expected: type) -> None:
    built = [client_from_options(command, must_exist=True, shared_observations=True), client_from_options(prepared)]
    try:
        assert [type(client) for client in built] == [expected, expected]
    finally:
        for client in built:
            client.close()


def test_the_command_and_the_demo_give_sqlite_options_one_meaning(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = str(tmp_path / "locks.db")
    command, prepared = both_ways(["--path", path])
    assert command == prepared == StoreOptions("sqlite", path=path)
    assert_same_client(command, prepared, SQLiteClient)


def test_the_command_and_the_demo_give_redis_options_one_meaning(tmp_path, monkeypatch, redis_url):
    from fastlease.redis import RedisClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    command, prepared = both_ways(["--store", "redis", "--url", redis_url])
    assert command == prepared == StoreOptions("redis", url=redis_url)
    assert_same_client(command, prepared, RedisClient)
    monkeypatch.setenv("FASTLEASE_REDIS_URL", redis_url)  # --url's default, for the demo too
    command, prepared = both_ways(["--store", "redis"])
    assert prepared == StoreOptions("redis", url=redis_url) and command == StoreOptions("redis")
    assert_same_client(command, prepared, RedisClient)


def test_the_command_and_the_demo_give_dynamodb_options_one_meaning(tmp_path, monkeypatch, moto_endpoint):
    from fastlease.dynamodb import DynamoDBClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    command, prepared = both_ways(["--store", "dynamodb", "--endpoint-url", moto_endpoint, "--region", "us-east-1"])
    assert command == prepared == StoreOptions("dynamodb", endpoint_url=moto_endpoint, region="us-east-1")
    assert_same_client(command, prepared, DynamoDBClient)


def test_the_command_and_the_demo_give_postgres_options_one_meaning(tmp_path, monkeypatch, postgres_db):
    from fastlease.postgres import PostgresClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTLEASE_POSTGRES_DSN", raising=False)
    said: list[str] = []
    command, prepared = both_ways(["--store", "postgres", "--dsn", postgres_db], said)
    assert command == prepared == StoreOptions("postgres", dsn=postgres_db)
    assert said == [f"store: PostgreSQL at {postgres_db}"]  # the server given: none started
    assert_same_client(command, prepared, PostgresClient)
    monkeypatch.setenv("FASTLEASE_POSTGRES_DSN", postgres_db)  # --dsn's default, for the demo too
    command, prepared = both_ways(["--store", "postgres"])
    assert prepared == StoreOptions("postgres", dsn=postgres_db) and command == StoreOptions("postgres")
    assert_same_client(command, prepared, PostgresClient)
    client = PostgresClient(postgres_db)
    try:
        assert client.lock_table_exists(demo.TABLE)  # the demo made its table before any worker started
    finally:
        client.close()


def test_memory_is_the_demos_alone_and_its_workers_share_one_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "lives inside one process" in error_of(capsys, "list", "--table", "locks", "--store", "memory")
    store = MemoryStore()
    client = client_from_options(StoreOptions("memory"), memory_store=store)
    try:
        assert isinstance(client, MemoryClient) and client.store is store
    finally:
        client.close()
