"""The FastAPI integration in a real app (httpx over ASGI): the seed article's payment endpoint,
rewritten on fastlease, under 100 parallel duplicate POSTs; and the 400, 409 and 422 answers."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from fastlease import SQLiteClient
from fastlease.idempotency.fastapi import idempotent_route

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

    @router.post("/busy")
    async def busy() -> JSONResponse:
        charges.append("busy")
        return JSONResponse({"detail": "the provider is busy"}, status_code=503)

    @router.get("/balance")
    async def balance() -> dict:
        return {"charges": len(charges)}

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
    assert missing.status_code == 400 and "Idempotency-Key header is required" in missing.json()["detail"]
    assert too_long.status_code == 400 and spaced.status_code == 400
    assert balance.status_code == 200 and charges == []


def test_a_duplicate_in_flight_is_409_with_retry_after(client):
    app, charges, gate = payment_app(client)

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        gate.clear()
        async with http(app) as api:
            headers = {"Idempotency-Key": "slow"}
            first = asyncio.ensure_future(api.post("/process-payment", json={"amount": 5.0}, headers=headers))
            for _ in range(1000):  # bounded: until the first request holds the key
                if client.inspect("payments_locks"):
                    break
                await asyncio.sleep(0.005)
            duplicate = await api.post("/process-payment", json={"amount": 5.0}, headers=headers)
            gate.set()
            done = await first
            again = await api.post("/process-payment", json={"amount": 5.0}, headers=headers)
            return duplicate, done, again

    duplicate, done, again = asyncio.run(main())
    assert duplicate.status_code == 409 and duplicate.headers["Retry-After"] == "1"
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
