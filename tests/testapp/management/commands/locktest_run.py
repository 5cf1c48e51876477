"""Test command for the lock decorators: record a run in Redis, sleep, record its end.

``locktest_run single --sleep 1`` is guarded by @single_flight, ``locktest_run locked
--wait 5`` by @locked; both use the lock name "locktest-run" (derived from arguments).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from django_redispatterns.locks import locked, single_flight
from tests.redis_servers import KEY_PREFIX, raw_client

RUNS_KEY = f"{KEY_PREFIX}:locktest:runs"


def harness() -> redis.Redis:
    """The tests' bookkeeping client: the harness's user when the app's is a least-privilege
    one, with the run's certificates over rediss://."""
    return raw_client(os.environ.get("RPTEST_HARNESS_URL") or settings.REDIS_URL)


def record(event: str) -> None:
    client = harness()
    pipe = client.pipeline()
    pipe.rpush(RUNS_KEY, event)
    pipe.pexpire(RUNS_KEY, 60_000)
    pipe.execute()


def _work(command: BaseCommand, options: dict[str, Any]) -> None:
    record(f"start {time.time():.6f} {command.fencing_token}")  # type: ignore[attr-defined]
    time.sleep(options["sleep"])
    if options["hold_until"]:  # hold the lock until the test says so (bounded)
        client = harness()
        deadline = time.monotonic() + 30
        while not client.exists(options["hold_until"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    record(f"end {time.time():.6f}")
    command.stdout.write(f"ran with fencing token {command.fencing_token}")  # type: ignore[attr-defined]


class Command(BaseCommand):
    help = "Exercise @single_flight / @locked from several processes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("mode", choices=["single", "locked"])
        parser.add_argument("--sleep", type=float, default=1.0)
        parser.add_argument("--wait", type=float, default=0.0)
        parser.add_argument("--hold-until", default="", help="a Redis key to wait for")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["mode"] == "single":
            self.single(**options)
        else:
            locked(name="locktest-run", ttl=2, wait=options["wait"])(_locked_body)(self, **options)

    @single_flight(name=lambda **options: "locktest-run", ttl=2)
    def single(self, **options: Any) -> None:
        _work(self, options)


def _locked_body(command: BaseCommand, **options: Any) -> None:
    _work(command, options)
