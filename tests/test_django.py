"""The Django integration on the test project (``tests/django_project``), through Django's test client,
on SQLite and on PostgreSQL: the settings' client, ``check_in`` inside ``transaction.atomic()`` (it
fences: a takeover rolls the block back), idempotent views (function, class-based, DRF view and
viewset) with the FastAPI integration's answers, and the ``fastlease`` management command. The
views count their executions in a table, so every "runs once" is counted, not inferred."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import transaction
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.test import Client, RequestFactory
from django.test.utils import override_settings

from fastlease import LockLost, MemoryClient, PostgresClient, SQLiteClient, SyncDistributedLock
from fastlease.django import check_in, close_client, get_client, store_options
from fastlease.django.idempotency import idempotent_view
from fastlease.testing import NO_USAGE

#: The fixtures django_setup and django_alias.
pytest_plugins = ["django_project.fixtures"]

PROBLEM = "tag:fastlease,2026:idempotency-key-"


def rows(alias: str) -> Any:
    """The Execution rows of the database ``alias`` (the model is loaded once Django is set up)."""
    from django_project.models import Execution

    return Execution.objects.using(alias)


def executions(alias: str, key: str, view: str = "") -> int:
    found = rows(alias).filter(key=key)
    return (found.filter(view=view) if view else found).count()


def problem_of(response: Any, status: int, name: str) -> dict:
    """The problem+json body of ``response``, checked to be problem ``name`` with ``status``."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["type"] == PROBLEM + name and body["status"] == status and body["title"], body
    return body


def post(path: str, body: Any, key: str | None = None, **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    return Client(raise_request_exception=False).post(path, json.dumps(body), content_type="application/json",
                                                      headers=headers)


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


# ---- the settings' client -------------------------------------------------------------------------
def test_the_settings_client_is_on_the_database_alias_and_one_per_process(django_alias, in_forked_child):
    client = get_client()
    assert get_client() is client
    if django_alias == "default":
        assert isinstance(client, SQLiteClient) and store_options().store == "sqlite"
    else:
        assert isinstance(client, PostgresClient) and store_options().store == "postgres"
    child = in_forked_child(lambda: "new" if get_client() is not client else "inherited")
    assert child == "new"
    close_client()
    assert get_client() is not client  # made again from the settings


@pytest.mark.parametrize("setting, message", [
    ({"DATABASE": "missing"}, r"'missing', which is not in settings.DATABASES \(its aliases: 'default'"),
    ({"DATABASE": "oracle"}, r"ENGINE is 'django.db.backends.oracle': it supports PostgreSQL .* and SQLite"),
    ({"DATABASE": "memory"}, r"in-memory SQLite database \(':memory:'\).* give it a file as NAME"),
    ({"DATABSE": "default"}, r"unknown keys \['DATABSE'\]: it takes DATABASE, POSTGRES_DSN, SQLITE_PATH"),
    ({"DATABASE": "default", "SQLITE_PATH": "x.db"}, r"names its store 2 times \(DATABASE, SQLITE_PATH\)"),
    ({"SQLITE_PATH": "{tmp}/x.db", "CLIENT_OPTIONS": {"renewal": "never"}},
     r"makes no SQLiteClient: renewal must be 'auto' or 'thread'"),
    ("default", r"settings.FASTLEASE must be a dict"),
])
def test_bad_settings_are_improperly_configured_naming_the_setting(django_setup, tmp_path, setting, message):
    if isinstance(setting, dict) and "SQLITE_PATH" in setting:
        setting = {**setting, "SQLITE_PATH": setting["SQLITE_PATH"].format(tmp=tmp_path)}
    with override_settings(FASTLEASE=setting), pytest.raises(ImproperlyConfigured, match=message):
        get_client()


def test_explicit_store_settings_and_client_options(django_setup, tmp_path):
    with override_settings(FASTLEASE={"SQLITE_PATH": tmp_path / "leases.db",
                                      "CLIENT_OPTIONS": {"renewal": "thread"}}):
        client = get_client()
        assert isinstance(client, SQLiteClient) and client.store.path == str(tmp_path / "leases.db")
        assert client.engine.link is None  # renewal="thread": no renewal process
    if django_setup.postgres_dsn is not None:
        with override_settings(FASTLEASE={"POSTGRES_DSN": django_setup.postgres_dsn}):
            assert isinstance(get_client(), PostgresClient)
    close_client()


def test_fastlease_django_imports_without_settings_and_http_without_frameworks():
    code = ("import sys, fastlease.idempotency.http\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'fastapi', 'starlette')]\n"
            "import fastlease.django, fastlease.django.idempotency\n"
            "from django.core.exceptions import ImproperlyConfigured\n"
            "try:\n    fastlease.django.get_client()\n"
            "except ImproperlyConfigured as error:\n    print('refused:', error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: Requested setting FASTLEASE, but settings are not configured")


# ---- check_in inside transaction.atomic() ---------------------------------------------------------
def _thief(django_alias: str, django_setup) -> Any:
    """Another process's client on the same store."""
    options = store_options()
    return PostgresClient(options.dsn) if options.store == "postgres" else SQLiteClient(options.path)


def test_check_in_with_the_lease_held_commits_the_block(django_alias):
    key = new_key()
    with SyncDistributedLock(get_client(), table="locks", key=key) as lease:
        with transaction.atomic(using=django_alias):
            rows(django_alias).create(view="settle", key=key, pid=0)
            check_in(lease, using=django_alias)
    assert executions(django_alias, key) == 1


def test_check_in_after_a_takeover_raises_lock_lost_and_rolls_the_block_back(django_alias, django_setup):
    key = new_key()
    thief = _thief(django_alias, django_setup)
    try:
        with pytest.raises(LockLost) as at_exit:
            with SyncDistributedLock(get_client(), table="locks", key=key, lease_duration=30) as lease:
                # A contender that saw the row unchanged for a whole lease takes it over: its store step.
                row = thief.store.read("locks", key, 5.0, NO_USAGE)
                assert thief.store.replace_if("locks", key, row.owner, row.version, "thief", "v-thief", 30_000,
                                              5.0, NO_USAGE)
                assert lease.is_valid()  # nothing local knows yet: only the store does
                with pytest.raises(LockLost) as info:
                    with transaction.atomic(using=django_alias):
                        rows(django_alias).create(view="settle", key=key, pid=0)
                        check_in(lease, using=django_alias)
                assert info.value.cause == "stolen"
                with transaction.atomic(using=django_alias):  # caught inside the block: it still rolls back
                    rows(django_alias).create(view="settle", key=key, pid=1)
                    with pytest.raises(LockLost):
                        check_in(lease, using=django_alias)
        assert at_exit.value.cause == "stolen"
    finally:
        thief.close()
    assert executions(django_alias, key) == 0


def test_check_in_outside_an_atomic_block_or_in_a_failed_one_is_refused(django_alias):
    from django.db import IntegrityError
    from django.db.transaction import TransactionManagementError

    with SyncDistributedLock(get_client(), table="locks", key=new_key()) as lease:
        with pytest.raises(TransactionManagementError, match=r"runs inside transaction.atomic\(using="):
            check_in(lease, using=django_alias)
        with transaction.atomic(using=django_alias):
            try:
                with transaction.atomic(using=django_alias, savepoint=False):
                    rows(django_alias).create(id=-1, view="x", key="x", pid=0)
                    rows(django_alias).create(id=-1, view="x", key="x", pid=0)
            except IntegrityError:
                pass
            with pytest.raises(TransactionManagementError, match="has already failed"):
                check_in(lease, using=django_alias)
    assert executions(django_alias, "x") == 0


# ---- idempotent views -------------------------------------------------------------------------------
def test_a_function_view_runs_once_and_replays_status_body_and_kept_headers(django_alias):
    key = new_key()
    first = post("/payments", {"amount": 25}, key)
    again = post("/payments", {"amount": 25}, key)
    assert first.status_code == 201 and again.status_code == 201
    assert again.content == first.content and again["Location"] == first["Location"]
    assert again["Content-Type"] == "application/json" and again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first and "X-Request-Id" in first and "X-Request-Id" not in again
    assert executions(django_alias, key) == 1


def test_missing_malformed_in_progress_and_reused_keys_are_problems(django_alias):
    key = new_key()
    missing = post("/payments", {"amount": 1})
    assert "Idempotency-Key header is required" in problem_of(missing, 400, "missing")["detail"]
    for field, reason in (("a b", "not visible ASCII"), ('"a", "b"', "unexpected"), ("x" * 256, "256 characters")):
        assert reason in problem_of(post("/payments", {"amount": 1}, field), 400, "malformed")["detail"]
    with SyncDistributedLock(get_client(), table="payments_locks", key=f"http:-:{key}"):  # a request in flight
        in_flight = post("/payments", {"amount": 1}, key)
    problem_of(in_flight, 409, "in-progress")
    assert in_flight["Retry-After"] == "1"
    assert post("/payments", {"amount": 1}, key).status_code == 201
    reused = problem_of(post("/payments", {"amount": 2}, key), 422, "reused")
    assert "different request" in reused["detail"] and reused["title"] == "Idempotency-Key is already used"
    assert executions(django_alias, key) == 1 and executions(django_alias, "", "payment") == 0


def test_the_quoted_and_the_bare_forms_are_one_key(django_alias):
    key = new_key()
    first = post("/payments", {"amount": 3}, f'"{key}";v=1')
    same = post("/payments", {"amount": 3}, key)
    assert first.status_code == 201 and same["Idempotent-Replayed"] == "true" and same.content == first.content
    assert rows(django_alias).filter(key__contains=key).count() == 1  # (the views record the field as sent)


def test_client_errors_are_stored_and_server_errors_are_retried(django_alias):
    refused, failed, busy = new_key(), new_key(), new_key()
    answers = [post("/refunds", {"amount": 500}, refused) for _ in range(2)]
    assert [a.status_code for a in answers] == [403, 403] and answers[1]["Idempotent-Replayed"] == "true"
    assert [post("/refunds", {"amount": -1}, failed).status_code for _ in range(2)] == [500, 500]
    assert [post("/busy", {}, busy).status_code for _ in range(2)] == [503, 503]
    assert [executions(django_alias, key) for key in (refused, failed, busy)] == [1, 2, 2]


def test_a_class_based_view_through_method_decorator_with_an_optional_key(django_alias):
    key = new_key()
    assert [post("/notes", {"n": 1}).status_code for _ in range(2)] == [200, 200]  # keyless: runs each time
    first, again = post("/notes", {"n": 1}, key), post("/notes", {"n": 1}, key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert executions(django_alias, key) == 1 and executions(django_alias, "", "note") == 2


def test_a_drf_view_scopes_keys_and_stores_its_rendered_answers(django_alias):
    key = new_key()
    alice, bob, alice_again = (post("/api/payments", {"amount": 1}, key, X_Customer=customer)
                               for customer in ("alice", "bob", "alice"))
    assert alice.status_code == bob.status_code == 201 and alice.content != bob.content
    assert alice_again.content == alice.content and alice_again["Idempotent-Replayed"] == "true"
    assert alice_again["Content-Type"] == "application/json"
    invalid = new_key()
    refused = [post("/api/payments", {"sum": 1}, invalid) for _ in range(2)]  # DRF's ValidationError: final
    assert [r.status_code for r in refused] == [400, 400] and refused[1]["Idempotent-Replayed"] == "true"
    assert json.loads(refused[1].content) == {"amount": ["This field is required."]}
    problem_of(post("/api/payments", {"amount": 1}), 400, "missing")
    assert executions(django_alias, key) == 2 and executions(django_alias, invalid) == 0


def test_a_drf_viewset_action_through_method_decorator(django_alias):
    key, unknown = new_key(), new_key()
    first, again = post("/api/orders", {"sku": "a"}, key), post("/api/orders", {"sku": "a"}, key)
    assert first.status_code == 201 and again.content == first.content and again["Idempotent-Replayed"] == "true"
    missing = [post("/api/orders", {"sku": "unknown"}, unknown) for _ in range(2)]
    assert [m.status_code for m in missing] == [404, 404] and missing[1]["Idempotent-Replayed"] == "true"
    assert executions(django_alias, key) == 1 and executions(django_alias, unknown) == 1


def test_client_overrides_the_settings_client_and_bad_uses_are_refused(django_setup):
    client = MemoryClient()
    runs: list[int] = []

    @idempotent_view(table="orders", client=client)
    def view(request: Any) -> HttpResponse:
        runs.append(1)
        return JsonResponse({"run": len(runs)})

    factory = RequestFactory()
    for _ in range(2):
        answer = view(factory.post("/o", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"))
    assert runs == [1] and answer["Idempotent-Replayed"] == "true"
    assert client.store.read_record("orders", "http:-:k", 5.0) is not None  # on the given client's store
    with pytest.raises(TypeError, match="decorates sync views, and .*later is async def"):
        @idempotent_view(table="orders", client=client)
        async def later(request: Any) -> HttpResponse:
            raise AssertionError("never runs")
    with pytest.raises(TypeError, match=r"first argument \(a method's second\) is the request; .* got int, str"):
        view(1, "2")
    with pytest.raises(ValueError, match="table"):
        idempotent_view(table="x")

    @idempotent_view(table="orders", client=client)
    def stream(request: Any) -> StreamingHttpResponse:
        runs.append(2)
        return StreamingHttpResponse(iter([b"a", b"b"]))

    for _ in range(2):  # refused, and nothing stored: the next request runs again
        with pytest.raises(TypeError, match="StreamingHttpResponse has no body to store: idempotent endpoints "
                                            "cannot stream"):
            stream(factory.post("/s", b"", content_type="text/plain", HTTP_IDEMPOTENCY_KEY="s"))
    assert runs == [1, 2, 2]
    client.close()


# ---- the management command --------------------------------------------------------------------------
def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("fastlease", *args, stdout=out)
    return out.getvalue()


def test_createtables_makes_the_tables_once_and_the_cli_subcommands_read_them(django_alias):
    again = run_command("createtables", "--lock-table", "locks", "--idempotency-table", "payments")
    if django_alias == "postgres":
        client = get_client()
        assert all(client.lock_table_exists(name) for name in ("locks", "payments", "payments_locks"))
        assert "lock table 'locks' already exists" in again and "idempotency table 'payments' already" in again
    else:
        assert "SQLite needs no lock table made" in again and "nothing to do" in again
    key = new_key()
    with SyncDistributedLock(get_client(), table="locks", key=key) as lease:
        assert f"{key}: held by {lease.owner}" in run_command("status", key, "--table", "locks")
        listed = json.loads(run_command("list", "--table", "locks", "--json"))
        assert [row["owner"] for row in listed if row["key"] == key] == [lease.owner]
    assert run_command("status", key, "--table", "locks").strip() == f"{key}: free"


def test_the_command_refuses_bad_names_and_nothing_to_do(django_alias):
    with pytest.raises(CommandError, match=r"argument --lock-table 'a\*b'") as bad:
        run_command("createtables", "--lock-table", "a*b")
    assert bad.value.returncode == 2
    with pytest.raises(CommandError, match="name the tables to create"):
        run_command("createtables")
    with pytest.raises(CommandError, match="argument KEY") as bad_key:
        run_command("status", "", "--table", "locks")
    assert bad_key.value.returncode == 2
