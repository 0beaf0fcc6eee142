"""Views of each kind ``idempotent_view`` decorates. Each records an Execution when its body runs, in
the database that ``FASTLEASE['DATABASE']`` names (the one the leases live on), so that tests count
executions rather than requests."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ViewSet

from django_project.models import Execution
from fastlease.django.idempotency import idempotent_view

#: The payment provider's latency: long enough that concurrent duplicates find the first in flight.
PROVIDER_LATENCY_S = 0.1


def database() -> str:
    """The alias the leases live on, and so the views' writes."""
    return str(settings.FASTLEASE["DATABASE"])


def record(view: str, request: Any) -> Execution:
    """Count one execution of ``view``'s body, committed at once (before the view's answer)."""
    with transaction.atomic(using=database()):
        return Execution.objects.using(database()).create(
            view=view, key=request.headers.get("Idempotency-Key", ""), pid=os.getpid())


def health(request: HttpRequest) -> HttpResponse:
    """What the server test polls until gunicorn's workers answer."""
    return HttpResponse("ok", content_type="text/plain")


@idempotent_view(table="payments")
def payment(request: HttpRequest) -> JsonResponse:
    """A charge that must happen once per Idempotency-Key."""
    amount = json.loads(request.body or b"{}").get("amount")
    time.sleep(PROVIDER_LATENCY_S)  # the provider's latency (the tests never wait on it)
    execution = record("payment", request)
    response = JsonResponse({"payment_id": f"payment_{execution.pk}", "amount": amount, "pid": os.getpid()},
                            status=201)
    response["Location"] = f"/payments/{execution.pk}"
    response["X-Request-Id"] = f"request-{execution.pk}"  # per response: not among the replayed headers
    return response


@idempotent_view(table="payments")
def refund(request: HttpRequest) -> JsonResponse:
    """A refund: refused above 100 (403, a final answer), failing below 0 (500, retried)."""
    record("refund", request)
    amount = json.loads(request.body)["amount"]
    if amount > 100:
        raise PermissionDenied("refund above the limit")
    if amount < 0:
        raise RuntimeError("the provider is down")
    return JsonResponse({"refunded": amount})


@idempotent_view(table="payments")
def busy(request: HttpRequest) -> JsonResponse:
    """A provider that is busy: a 503, which is never stored."""
    record("busy", request)
    return JsonResponse({"detail": "the provider is busy"}, status=503)


@method_decorator(idempotent_view(table="payments", required=False), name="post")
class NoteView(View):
    """A class-based view, decorated through method_decorator; the key is optional here."""

    def post(self, request: HttpRequest) -> JsonResponse:
        record("note", request)
        return JsonResponse({"bytes": len(request.body)})


class PaymentAPI(APIView):
    """A DRF view whose method is decorated directly; keys are scoped per customer."""

    @idempotent_view(table="payments", scope=lambda request: request.headers.get("X-Customer", ""))
    def post(self, request: Request) -> Response:
        if "amount" not in request.data:
            raise ValidationError({"amount": ["This field is required."]})
        execution = record("api-payment", request)
        return Response({"payment_id": f"payment_{execution.pk}", "amount": request.data["amount"]}, status=201)


class OrderViewSet(ViewSet):
    """A DRF viewset whose action is decorated through method_decorator."""

    @method_decorator(idempotent_view(table="payments"))
    def create(self, request: Request) -> Response:
        record("order", request)
        if request.data.get("sku") == "unknown":
            raise NotFound("no such product")
        return Response({"ordered": request.data.get("sku")}, status=201)
