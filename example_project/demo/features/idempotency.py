"""Idempotency demo: a "pay" button that can be double-submitted, retried and tampered with.

The page hands out a fresh Idempotency-Key with every render; the browser sends the POST
with it (twice at once for the double submit). The pay view is slow on purpose, so the
second copy arrives while the first runs: it gets 409, a later retry gets the replay, and
the "charges made" counter only moves once per key.

The receipt view answers a TemplateResponse, rendered by Django after the view returned,
and its template fails: the claim is freed all the same, so a retry runs again (500, not
409 for the next hour).
"""

from __future__ import annotations

import json
import time
import uuid

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from django_redispatterns.idempotency import idempotent

CHARGES = "demo:idempotency:charges"


def _charges() -> int:
    return int(cache.get(CHARGES) or 0)


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    # Anonymous visitors are scoped by their session: make sure there is one.
    request.session.setdefault("idempotency_demo", True)
    return render(request, "demo/idempotency.html", {
        "key": str(uuid.uuid4()), "charges": _charges(),
    })


@require_POST
@idempotent(required=True, ttl=3600)
def pay(request: HttpRequest) -> HttpResponse:
    try:
        amount = int(json.loads(request.body)["amount"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "send {\"amount\": <int>}"}, status=400)
    time.sleep(1.5)  # the payment provider takes its time
    cache.add(CHARGES, 0, timeout=24 * 3600)
    total = cache.incr(CHARGES)
    return JsonResponse({"charge": f"ch_{uuid.uuid4().hex[:12]}", "amount": amount,
                         "charges_made": total}, status=201)


class _OutOfPaper:
    @property
    def receipt(self) -> str:
        raise RuntimeError("the receipt printer is out of paper")


@require_POST
@idempotent(required=True, ttl=3600)
def receipt(request: HttpRequest) -> TemplateResponse:
    return TemplateResponse(request, "demo/idempotency_receipt.txt",
                            {"printer": _OutOfPaper()}, status=201, content_type="text/plain")


urlpatterns = [path("", index, name="index"), path("pay/", pay, name="pay"),
               path("receipt/", receipt, name="receipt")]
