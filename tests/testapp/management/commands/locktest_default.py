"""Test command: @single_flight with every default (the lock is named after the command)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_redispatterns.locks import single_flight


class Command(BaseCommand):
    help = "Prints its fencing token; skips while another run holds 'locktest_default'."

    @single_flight()
    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"fencing token {self.fencing_token}")  # type: ignore[attr-defined]
