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
    for key in report.get("largest", []):
        key["ttl"] = _duration(key.get("ttl_ms"))
    return report, ""


def _duration(ttl_ms: int | None) -> str:
    """A Redis PTTL as people read it: "none" (-1), "gone" (-2), else "4 min 10 s"."""
    if ttl_ms is None or ttl_ms == -2:
        return "gone"
    if ttl_ms == -1:
        return "none"
    seconds = round(ttl_ms / 1000)
    if seconds < 60:
        return f"{seconds} s" if seconds else f"{ttl_ms} ms"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    audit, audit_error = _audit()
    servers = [{"facts": r.facts, "used_by": r.used_by} for r in gather()]
    return render(request, "demo/checks.html", {
        "results": _check_results(),
        "servers": servers,
        "audit": audit,
        "audit_error": audit_error,
        "catalogue": [{"id": f"redispatterns.{m.id}", "msg": _PLACEHOLDER.sub("…", m.msg),
                       "level": m.level.__name__.lower()}
                      for m in MESSAGES],
    })


urlpatterns = [path("", index, name="index")]
