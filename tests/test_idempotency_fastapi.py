"""The FastAPI integration in a real app (httpx over ASGI, and FastAPI's TestClient): the seed article's
payment endpoint, rewritten on fastlease, under 100 parallel duplicate POSTs; the 400, 409 and 422
answers and their problem+json bodies; the Idempotency-Key syntax; JSON fingerprints; and the README's
example."""

from __future__ import annotations

import asyncio
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from fastlease import SQLiteClient
from fastlease.idempotency.fastapi import idempotent_route
from helpers.waiting import wait_until_async

with warnings.catch_warnings():
    # Starlette 1.x prefers httpx2 for its TestClient and warns on import when it finds httpx, the
    # client the README documents; both drive the app the same way.
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

PROBLEM = "tag:fastlease,2026:idempotency-key-"
README = Path(__file__).resolve().parents[1] / "README.md"

BOUND_S = 30.0


class Payment(BaseModel):
    amount: float


def payment_app(client: Any, **options: Any) -> tuple[FastAPI, list[str], asyncio.Event]:
    """The article's /process-payment: a slow charge that must happen once per Idempotency-Key."""
    charges: list[str] = []
    gate = asyncio.Event()
    gate.set()
    router = APIRouter(route_class=idempotent_route(client, table="payments", **options))

    @router.post("/process-payment", status_code=201)
    async def process_payment(payment: Payment) -> dict:
        await asyncio.wait_for(gate.wait(), BOUND_S)
        await asyncio.sleep(0.05)  # the payment provider's latency
        payment_id = f"payment_{uuid.uuid4()}"
        charges.append(payment_id)
        return {"message": "Payment processed successfully", "payment_id": payment_id, "amount": payment.amount}

    @router.post("/refund")
    async def refund(payment: Payment) -> dict:
        charges.append("refund-attempt")
        if payment.amount > 100:
            raise HTTPException(status_code=402, detail="refund above the limit")
        if payment.amount < 0:
            raise RuntimeError("the provider is down")
        return {"refunded": payment.amount}

    @router.get("/balance")
    async def balance() -> dict:
        return {"charges": len(charges)}

    @router.post("/busy")
    async def busy() -> JSONResponse:
        charges.append("busy")
        return JSONResponse({"detail": "the provider is busy"}, status_code=503)

    @router.post("/notes")
    async def note(request: Request) -> dict:
        charges.append("note")
        return {"bytes": len(await request.body())}

    app = FastAPI()
    app.include_router(router)
    return app, charges, gate


@pytest.fixture
def client(tmp_path):
    opened = SQLiteClient(tmp_path / "api.db")
    yield opened
    opened.close()


def http(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://test", timeout=BOUND_S)


def problem_of(response: httpx.Response, status: int, name: str) -> dict:
    """The problem+json body of ``response``, checked to be problem ``name`` with ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == PROBLEM + name and body["status"] == status and body["title"], body
    return body


def test_a_hundred_parallel_duplicates_charge_once_and_replay_identically(client):
    app, charges, _ = payment_app(client, wait=BOUND_S)

    async def main() -> list[httpx.Response]:
        async with http(app) as api:
            return list(await asyncio.gather(*(
                api.post("/process-payment", json={"amount": 25.0}, headers={"Idempotency-Key": "pay-123"})
                for _ in range(100)
            )))

    responses = asyncio.run(main())
    assert len(charges) == 1
    assert {response.status_code for response in responses} == {201}
    assert len({response.content for response in responses}) == 1
    assert responses[0].json()["payment_id"] == charges[0]
    replayed = [response for response in responses if response.headers.get("Idempotent-Replayed") == "true"]
    assert len(replayed) == 99
    assert all(response.headers["content-type"] == "application/json" for response in responses)


def test_missing_or_bad_keys_are_400_and_nothing_runs(client):
    app, charges, _ = payment_app(client)

    async def main() -> list[httpx.Response]:
        async with http(app) as api:
            return [
                await api.post("/process-payment", json={"amount": 1.0}),
                await api.post("/process-payment", json={"amount": 1.0}, headers={"Idempotency-Key": "x" * 256}),
                await api.post("/process-payment", json={"amount": 1.0}, headers={"Idempotency-Key": "a b"}),
                await api.get("/balance"),  # GET is not guarded
            ]

    missing, too_long, spaced, balance = asyncio.run(main())
    assert "Idempotency-Key header is required" in problem_of(missing, 400, "missing")["detail"]
    problem_of(too_long, 400, "malformed")
    problem_of(spaced, 400, "malformed")
    assert balance.status_code == 200 and charges == []


def test_a_duplicate_in_flight_is_409_with_retry_after(client):
    app, charges, gate = payment_app(client)

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        gate.clear()
        async with http(app) as api:
            headers = {"Idempotency-Key": "slow"}
            first = asyncio.ensure_future(api.post("/process-payment", json={"amount": 5.0}, headers=headers))
            await wait_until_async(lambda: client.inspect("payments_locks"), 5, "the first request to hold the key")
            duplicate = await api.post("/process-payment", json={"amount": 5.0}, headers=headers)
            gate.set()
            done = await first
            again = await api.post("/process-payment", json={"amount": 5.0}, headers=headers)
            return duplicate, done, again

    duplicate, done, again = asyncio.run(main())
    problem_of(duplicate, 409, "in-progress")
    assert duplicate.headers["Retry-After"] == "1"
    assert done.status_code == 201 and again.content == done.content
    assert again.headers["Idempotent-Replayed"] == "true" and len(charges) == 1


def test_a_key_reused_with_another_body_is_422(client):
    app, charges, _ = payment_app(client)

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with http(app) as api:
            headers = {"Idempotency-Key": "k"}
            first = await api.post("/process-payment", json={"amount": 5.0}, headers=headers)
            other = await api.post("/process-payment", json={"amount": 6.0}, headers=headers)
            return first, other

    first, other = asyncio.run(main())
    assert first.status_code == 201 and other.status_code == 422 and len(charges) == 1


def test_client_errors_are_stored_and_server_errors_are_retried(client):
    app, charges, _ = payment_app(client)

    async def main() -> list[httpx.Response]:
        async with http(app) as api:
            big = {"Idempotency-Key": "big"}
            down = {"Idempotency-Key": "down"}
            return [
                await api.post("/refund", json={"amount": 500.0}, headers=big),
                await api.post("/refund", json={"amount": 500.0}, headers=big),
                await api.post("/refund", json={"amount": -1.0}, headers=down),
                await api.post("/refund", json={"amount": -1.0}, headers=down),
            ]

    refused, refused_again, failed, failed_again = asyncio.run(main())
    assert refused.status_code == 402 and refused.json() == {"detail": "refund above the limit"}
    assert refused_again.status_code == 402 and refused_again.headers["Idempotent-Replayed"] == "true"
    assert failed.status_code == 500 and failed_again.status_code == 500
    assert charges == ["refund-attempt", "refund-attempt", "refund-attempt"]  # 402 once, the 500 twice


def test_scoped_keys_keep_clients_apart(client):
    app, charges, _ = payment_app(client, scope=lambda request: request.headers.get("X-Customer", ""))

    async def main() -> list[httpx.Response]:
        async with http(app) as api:
            return [
                await api.post("/process-payment", json={"amount": 1.0},
                               headers={"Idempotency-Key": "same", "X-Customer": customer})
                for customer in ("alice", "bob", "alice")
            ]

    alice, bob, alice_again = asyncio.run(main())
    assert alice.json()["payment_id"] != bob.json()["payment_id"]
    assert alice_again.content == alice.content and len(charges) == 2


def test_a_returned_5xx_response_is_not_stored_and_the_retry_runs(client):
    app, charges, _ = payment_app(client)

    async def main() -> list[httpx.Response]:
        async with http(app) as api:
            return [await api.post("/busy", headers={"Idempotency-Key": "b"}) for _ in range(2)]

    responses = asyncio.run(main())
    assert [response.status_code for response in responses] == [503, 503]
    assert "Idempotent-Replayed" not in responses[1].headers and charges == ["busy", "busy"]


# ---- problem+json answers, the header's syntax, JSON fingerprints -------------------------------------
def test_the_same_json_in_another_form_is_the_same_request_and_other_bodies_count_by_bytes(client):
    app, charges, _ = payment_app(client)
    json_type = {"Content-Type": "application/json"}
    with TestClient(app) as http:
        first = http.post("/process-payment", content=b'{"amount": 5.0, "note": "\\u00e9t\xc3\xa9"}',
                          headers={"Idempotency-Key": "j", **json_type})
        same = http.post("/process-payment", content='{ "note":"\u00e9t\u00e9" ,\n "amount":5.0}'.encode(),
                         headers={"Idempotency-Key": "j", **json_type})
        other = http.post("/process-payment", content=b'{"amount": 5.0, "note": "ete"}',
                          headers={"Idempotency-Key": "j", **json_type})
        assert first.status_code == 201 and same.status_code == 201 and len(charges) == 1
        assert same.headers["Idempotent-Replayed"] == "true" and same.content == first.content
        problem_of(other, 422, "reused")

        text = {"Content-Type": "text/plain"}
        note = http.post("/notes", content=b'{"a": 1}', headers={"Idempotency-Key": "t", **text})
        respaced = http.post("/notes", content=b'{"a":1}', headers={"Idempotency-Key": "t", **text})
        repeated = http.post("/notes", content=b'{"a": 1}', headers={"Idempotency-Key": "t", **text})
    assert note.status_code == 200 and repeated.headers["Idempotent-Replayed"] == "true"
    problem_of(respaced, 422, "reused")  # not JSON by its type: the bytes differ
    assert charges.count("note") == 1


def test_a_reused_key_is_a_problem_422_that_tells_itself_from_fastapis_validation_422(client):
    app, charges, _ = payment_app(client)
    with TestClient(app) as http:
        assert http.post("/process-payment", json={"amount": 5.0}, headers={"Idempotency-Key": "k"}).status_code == 201
        reused = http.post("/process-payment", json={"amount": 6.0}, headers={"Idempotency-Key": "k"})
        invalid = http.post("/process-payment", json={"amount": "five"}, headers={"Idempotency-Key": "v"})
    body = problem_of(reused, 422, "reused")
    assert "different request" in body["detail"] and body["title"] == "Idempotency-Key is already used"
    assert invalid.status_code == 422 and invalid.headers["content-type"] == "application/json"
    assert "type" not in invalid.json() and isinstance(invalid.json()["detail"], list)
    assert len(charges) == 1


def test_problem_base_makes_the_problem_types_links_to_your_documentation(client):
    with pytest.raises(TypeError, match="problem_base must be a str"):
        idempotent_route(client, table="payments", problem_base=None)
    app, _, _ = payment_app(client, problem_base="https://api.example.com/problems/")
    with TestClient(app) as http:
        missing = http.post("/process-payment", json={"amount": 1.0})
    assert missing.json()["type"] == "https://api.example.com/problems/idempotency-key-missing"


@pytest.mark.parametrize("field, key", [
    ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ('  "padded"  ', "padded"),
    ('"with space"', "with space"),
    ('"a\\"quote\\\\"', 'a"quote\\'),
    ('"p";ignored;n=-12.345;t=tok/en:1;s="x;y";b=:aGk=:;f=?0', "p"),
    ("bare-8e03978e", "bare-8e03978e"),
    ("x" * 255, "x" * 255),
])
def test_the_key_is_a_structured_field_string_or_the_bare_form(client, field, key):
    app, charges, _ = payment_app(client)
    serialised = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    bare_form = all(" " < c <= "~" for c in key) and not key.startswith('"')
    # The other form of the same key: bare for a quoted field (where a bare form exists), else quoted.
    other_form = key if field.lstrip().startswith('"') and bare_form else serialised
    with TestClient(app) as http:
        first = http.post("/process-payment", json={"amount": 1.0}, headers={"Idempotency-Key": field})
        same = http.post("/process-payment", json={"amount": 1.0}, headers={"Idempotency-Key": other_form})
    assert first.status_code == 201 and same.headers["Idempotent-Replayed"] == "true", same.text
    assert len(charges) == 1
    assert client.store.read_record("payments", f"http:-:{key}", 5.0) is not None  # stored under the parsed key


@pytest.mark.parametrize("field, reason", [
    ('"unterminated', "no closing quote"),
    ('"a"b', "unexpected 'b' after the string"),
    ('"a\\x"', "a backslash escapes only"),
    ('""', "the key has 0 characters"),
    ('"a", "b"', "unexpected ', \"b\"' after the string"),
    ('"a";', "a parameter needs a lowercase key"),
    ('"a";K=1', "a parameter needs a lowercase key"),
    ('"a";k=1.2345', "a parameter has no valid value"),
    ('"a";k=1234567890123456', "a parameter has no valid value"),
    ('"a";k=', "a parameter has no valid value"),
    ("a b", "not visible ASCII"),
    ("x" * 256, "the key has 256 characters"),
    ('"' + "x" * 256 + '"', "the key has 256 characters"),
])
def test_a_malformed_key_is_a_problem_400_and_nothing_runs(client, field, reason):
    app, charges, _ = payment_app(client)
    with TestClient(app) as http:
        response = http.post("/process-payment", json={"amount": 1.0}, headers={"Idempotency-Key": field})
    detail = problem_of(response, 400, "malformed")["detail"]
    assert "structured-field string" in detail and reason in detail, detail
    assert charges == []


def test_a_key_sent_twice_or_outside_ascii_is_malformed(client):
    app, charges, _ = payment_app(client)
    with TestClient(app) as http:
        twice = http.post("/process-payment", json={"amount": 1.0},
                          headers=[("Idempotency-Key", '"a"'), ("Idempotency-Key", '"a"')])
        latin = http.post("/process-payment", json={"amount": 1.0},
                          headers={"Idempotency-Key": '"\xe9"'.encode("latin-1")})
    assert "sent 2 times" in problem_of(twice, 400, "malformed")["detail"]
    assert "printable ASCII only" in problem_of(latin, 400, "malformed")["detail"]
    assert charges == []


# ---- the README's example -------------------------------------------------------------------------------
def readme_fastapi_section() -> str:
    """The README's "Idempotency with FastAPI" section (up to the next level-2 heading)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("### Idempotency with FastAPI")
    return text[start:text.index("\n## ", start)]


def test_the_readme_example_answers_400_not_500_when_a_header_is_missing(tmp_path, monkeypatch):
    # The README's own code, run as it is written: its scope= reads X-User-Id, which a client may omit.
    code = re.search(r"```python\n(.*?)```", readme_fastapi_section(), re.DOTALL).group(1)
    assert "idempotent_route(" in code and "scope=" in code
    monkeypatch.chdir(tmp_path)  # the example opens api.db in the working directory
    namespace: dict[str, Any] = {"__name__": "readme_fastapi"}
    exec(compile(code, str(README), "exec"), namespace)
    body = {"amount": 500, "currency": "EUR"}
    try:
        with TestClient(namespace["app"], raise_server_exceptions=False) as http:
            no_user = http.post("/payments", json=body, headers={"Idempotency-Key": '"order-1"'})
            no_key = http.post("/payments", json=body, headers={"X-User-Id": "user-7"})
            neither = http.post("/payments", json=body)
            both = http.post("/payments", json=body, headers={"Idempotency-Key": '"order-1"', "X-User-Id": "user-7"})
    finally:
        namespace["client"].close()
    assert no_user.status_code == 400 and "X-User-Id" in no_user.json()["detail"]
    problem_of(no_key, 400, "missing")
    problem_of(neither, 400, "missing")
    assert both.status_code == 201 and "Idempotent-Replayed" not in both.headers  # and with both, the route runs


def test_the_readme_lists_httpx_for_testing_the_fastapi_example():
    section = readme_fastapi_section()
    assert "import httpx" in section  # the example's test uses it ...
    installs = re.findall(r"`(pip install [^`]*)`", section)
    assert any(re.search(r"\bhttpx\b", command) for command in installs), installs  # ... and says to install it
