"""Switching from django-ratelimit: the two keep their own counters (they restart at the
switch), and a shadow rule next to the old limiter warms ours so the switch opens no burst
window (docs/migration.md). Runs the real django-ratelimit."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import RequestFactory

from django_redispatterns.ratelimit import ratelimit

django_ratelimit = pytest.importorskip("django_ratelimit.decorators")
Ratelimited = pytest.importorskip("django_ratelimit.exceptions").Ratelimited


def view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


def hit(handler: Any, ip: str) -> int:
    request = RequestFactory().post("/pay/", REMOTE_ADDR=ip)
    try:
        return int(handler(request).status_code)
    except Ratelimited:  # django-ratelimit's block=True raises; Django answers 403
        return 403


def test_counters_restart_at_the_switch_without_a_shadow_rule() -> None:
    group = "adopt-" + secrets.token_hex(4)
    old = django_ratelimit.ratelimit(key="ip", rate="3/m", block=True)(view)
    new = ratelimit(rate="3/m", key="ip", group=group, algorithm="fixed_window")(view)
    assert [hit(old, "192.0.2.150") for _ in range(4)] == [200, 200, 200, 403]
    # ours never saw those requests: a fresh allowance (the burst window)
    assert [hit(new, "192.0.2.150") for _ in range(4)] == [200, 200, 200, 429]


def test_a_shadow_rule_next_to_the_old_limiter_leaves_no_burst_window() -> None:
    group = "adopt-" + secrets.token_hex(4)
    ours = dict(rate="3/m", key="ip", group=group, algorithm="fixed_window")
    # step 1: the old limiter decides, ours counts in shadow mode
    both = django_ratelimit.ratelimit(key="ip", rate="3/m", block=True)(
        ratelimit(**ours, shadow=True)(view))
    assert [hit(both, "192.0.2.151") for _ in range(3)] == [200, 200, 200]
    # step 2: ours alone, enforcing: its counters are warm
    new = ratelimit(**ours)(view)
    assert hit(new, "192.0.2.151") == 429
    assert hit(new, "192.0.2.152") == 200  # another client is not affected
