"""Locks demo: a @single_flight command, its fencing token, and a stale write being refused."""

from __future__ import annotations

from io import StringIO

from demo.models import FencedReport
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods

from django_redispatterns.locks import Lock, fenced_update, held_key

COMMAND = "nightly_report"  # @single_flight names the lock after the command


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    output = ""
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "run":
            out, err = StringIO(), StringIO()
            call_command(COMMAND, stdout=out, stderr=err)
            output = (out.getvalue() + err.getvalue()).strip()
        elif action == "hold":
            # Another "host" takes the lock for 10 s (no heartbeat: it simply expires).
            holder = Lock(COMMAND, ttl=10, auto_renew=False, owner="demo page")
            output = (f"holding {COMMAND!r} for 10 s with fencing token {holder.fencing_token}"
                      if holder.acquire() else f"{COMMAND!r} is already held")
        elif action == "stale":
            row = FencedReport.objects.filter(name="nightly").first()
            old = (row.fencing_token if row else 0) - 1
            accepted = fenced_update(FencedReport.objects.filter(name="nightly"), old,
                                     body="written by a paused, stale holder")
            output = (f"stale write with token {old}: "
                      f"{'accepted' if accepted else 'rejected, the row keeps the newer write'}")
        else:
            return redirect("locks:index")
    return render(request, "demo/locks.html", {
        "report": FencedReport.objects.filter(name="nightly").first(),
        "output": output,
        "lock_key": held_key(COMMAND),
    })


urlpatterns = [path("", index, name="index")]
