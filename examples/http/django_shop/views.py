"""The example shop's views: each charge goes through ``examples/http/charges.py``
(one line in ``$LEDGER``), ``?delay=S`` (or the ``X-Delay`` header) sleeping first.

- ``POST /charges``: a plain Django view, marked with ``idempotent()``;
- ``POST /drf/charges``: a DRF ``APIView`` with ``IdempotentMixin``;
- ``POST /async/charges``: an async Django view, marked with ``idempotent()``;
- ``POST /export?chunks=N&size=K``: a streamed response, guarded by the settings' paths;
- ``POST /notes``: not guarded (neither marked nor matched by the settings' paths).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_POST
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from examples.http.charges import BadCharge, Flaky, charge, parsed
from idemctl.http import Attempt
from idemctl.http.django import IdempotentMixin, idempotent


def _delay(request: HttpRequest | Request) -> float:
    return float(request.headers.get("x-delay") or request.GET.get("delay", 0))


def _attempt(request: HttpRequest | Request) -> Attempt | None:
    """The attempt the middleware runs the view in (its fencing token, ...); None when
    Django runs inside idemctl's ASGI middleware instead (tests/http/django_wrapped.py)."""
    return getattr(request, "idempotency", None)


@require_POST
@idempotent()
def charges(request: HttpRequest) -> HttpResponse:
    try:
        order, amount = parsed(json.loads(request.body))
    except (ValueError, BadCharge) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    try:
        done = charge(order, amount, _delay(request), _attempt(request))
    except Flaky as exc:
        return JsonResponse({"error": str(exc)}, status=500)
    return JsonResponse(done, status=201)


@require_POST
@idempotent()
async def async_charges(request: HttpRequest) -> HttpResponse:
    try:
        order, amount = parsed(json.loads(request.body))
    except (ValueError, BadCharge) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    try:  # the charge blocks (a file lock, a sleep): a thread, as a real client call would
        done = await asyncio.to_thread(charge, order, amount, _delay(request), _attempt(request))
    except Flaky as exc:
        return JsonResponse({"error": str(exc)}, status=500)
    return JsonResponse(done, status=201)


class DrfCharges(IdempotentMixin, APIView):
    idempotency: ClassVar[dict[str, Any]] = {"methods": ["POST"]}  # over the settings' OPTIONS

    def post(self, request: Request) -> Response:
        try:
            order, amount = parsed(request.data)
        except BadCharge as exc:
            return Response({"error": str(exc)}, status=400)
        try:
            done: dict[str, Any] = charge(order, amount, _delay(request), _attempt(request))
        except Flaky as exc:
            return Response({"error": str(exc)}, status=500)
        return Response(done, status=201)


@require_POST
def export(request: HttpRequest) -> StreamingHttpResponse:
    """A streamed response: ``chunks`` chunks of ``size`` bytes each."""
    chunks, size = int(request.GET["chunks"]), int(request.GET["size"])

    def parts() -> Iterator[bytes]:
        for i in range(chunks):
            yield bytes([65 + i % 26]) * size

    return StreamingHttpResponse(parts(), status=201, content_type="application/octet-stream")


@require_POST
def notes(request: HttpRequest) -> JsonResponse:
    """Not guarded: no key needed, each call runs."""
    return JsonResponse({"note": request.body.decode()}, status=200)
