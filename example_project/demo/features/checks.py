"""Checks demo: what `check --deploy` and `redis_audit` say about the demo's own Redis."""

from __future__ import annotations

import json
import re
from io import StringIO
from typing import Any

from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET

from django_redispatterns.checks import MESSAGES, gather

_PLACEHOLDER = re.compile(r"\{[^}]*\}")
LEVELS = {django_checks.DEBUG: "debug", django_checks.INFO: "info",
          django_checks.WARNING: "warning", django_checks.ERROR: "error",
          django_checks.CRITICAL: "critical"}


def _check_results() -> list[dict[str, Any]]:
    messages = django_checks.run_checks(tags=["redispatterns"],
                                        include_deployment_checks=True)
    return [{"id": m.id, "level": LEVELS.get(m.level, m.level), "msg": m.msg, "hint": m.hint,
             "silenced": m.is_silenced()} for m in messages]


def _audit() -> tuple[dict[str, Any] | None, str]:
    out = StringIO()
    try:
        call_command("redis_audit", "--json", "--top", "5", stdout=out, stderr=StringIO())
    except CommandError as exc:
        return None, str(exc)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report, ""


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    audit, audit_error = _audit()
    servers = [{"facts": r.facts, "used_by": r.used_by} for r in gather()]
    return render(request, "demo/checks.html", {
        "results": _check_results(),
        "servers": servers,
        "audit": audit,
        "audit_error": audit_error,
        "catalogue": [{"id": f"redispatterns.{m.id}", "msg": _PLACEHOLDER.sub("…", m.msg)}
                      for m in MESSAGES],
    })


urlpatterns = [path("", index, name="index")]
