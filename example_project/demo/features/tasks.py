"""Background tasks demo: a @locked task enqueued once per idempotency key, a busy lock, and
a rate-limited task (Django's tasks framework, immediate backend)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods

from django_redispatterns.exceptions import AlreadyEnqueued
from django_redispatterns.locks import Lock


def _outcome(result: Any) -> str:
    if result.errors:
        error = result.errors[-1].exception_class_path.rsplit(".", 1)[-1]
        return f"{result.status}: {error}"
    return f"{result.status}: returned {result.return_value!r}"


@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    from demo.models import FencedReport
    from demo.tasks import rebuild_statement, send_statement

    from django_redispatterns.contrib.tasks import enqueue_once

    account = (request.POST.get("account") or "acme")[:40]
    lines: list[str] = []
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "once":
            key = (request.POST.get("key") or "rebuild-1")[:100]
            try:
                result = enqueue_once(rebuild_statement, account, idempotency_key=key)
                lines.append(f"enqueued {result.id} with key {key!r}: {_outcome(result)}")
            except AlreadyEnqueued as exc:
                lines.append(f"key {key!r} was used already: task {exc.task_id} "
                             "(not enqueued again)")
        elif action == "busy":
            name = rebuild_statement.func.lock_name(account)
            with Lock(name, ttl=10, owner="demo page (another worker)"):
                result = rebuild_statement.enqueue(account)
            lines.append(f"while another worker holds {name!r}: {_outcome(result)} "
                         "(a worker backend would reschedule it in 10 s)")
        elif action == "send":
            for _ in range(3):
                lines.append(_outcome(send_statement.enqueue(account)))
            lines.append("2 runs a minute per account: the third is over the rate "
                         "(a worker backend defers it by the limiter's retry_after)")
        else:
            return redirect("tasks:index")
    return render(request, "demo/tasks.html", {
        "account": account,
        "lines": lines,
        "report": FencedReport.objects.filter(name=f"statement-{account}").first(),
    })


urlpatterns = [path("", index, name="index")]
