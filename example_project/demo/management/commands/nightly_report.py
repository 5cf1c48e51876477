"""``manage.py nightly_report``: runs on at most one host at a time (@single_flight).

Schedule it on every web host (cron, systemd timer): one run does the work, the others print
one "skipped" line and exit 0. The report row only accepts the write if this run's fencing
token is higher than the last writer's, so a run that lost its lease cannot clobber a newer one.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from demo.models import FencedReport
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_redispatterns.locks import fenced_update, single_flight


class Command(BaseCommand):
    help = "Build the nightly report (one host at a time)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=0.0, help="pretend to work")

    @single_flight(ttl=30)
    def handle(self, *args: Any, **options: Any) -> None:
        token: int = self.fencing_token  # type: ignore[attr-defined]
        time.sleep(options["seconds"])
        self.lock.check()  # type: ignore[attr-defined]  # stop early if the lease was lost
        FencedReport.objects.get_or_create(name="nightly")
        accepted = fenced_update(
            FencedReport.objects.filter(name="nightly"), token,
            body=f"report built at {timezone.now():%Y-%m-%d %H:%M:%S} UTC",
            written_by=f"{socket.gethostname()} (nightly_report)",
        )
        if accepted:
            self.stdout.write(f"report written with fencing token {token}")
        else:
            self.stderr.write(f"stale: a newer holder already wrote (our token {token})")
