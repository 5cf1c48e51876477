"""Rate-limit response headers.

``RateLimit-Policy`` and ``RateLimit`` follow the IETF HTTPAPI draft "RateLimit header
fields for HTTP" (draft-ietf-httpapi-ratelimit-headers): one list item per policy
applied to the request, named by the rule's ``name``::

    RateLimit-Policy: "api";q=100;w=60, "export";q=50;qu="requests";w=3600
    RateLimit: "api";r=42;t=17;pk=:Wm9vYmFyYmF6cXV4:, "export";r=40;t=3590;pk=:...:

``q``/``w``: the quota and its window in seconds; ``r``: the quota still available;
``t``: the effective window, seconds until more quota becomes available — never after the
``Retry-After`` of the same response; ``pk``: the partition key, a keyed hash of the
client's identity (never the identity); ``qu`` appears for a rule whose requests cost
more (or less) than one unit. An undecided rule (Redis did not answer) is listed in
``RateLimit-Policy`` only. Shadow rules appear nowhere.

With ``RATELIMIT['LEGACY_HEADERS']`` (default True) the older ``RateLimit-Limit``,
``RateLimit-Remaining`` and ``RateLimit-Reset`` trio describes the binding decision too.
Redirects (3xx) carry no rate-limit fields: a client could otherwise wait before following
the redirect.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from django.http import HttpRequest, HttpResponse

from ..conf import get_config
from .algorithms import Decision, whole_seconds

DECISIONS_ATTR = "_ratelimit_decisions"


def binding(decisions: Sequence[Decision]) -> Decision:
    """The decision the headers and ``request.ratelimit`` describe: the blocking one that
    lasts longest, else the decided one with the least room left, else the first."""
    if len(decisions) == 1:
        return decisions[0]
    blocked = [d for d in decisions if not d.allowed]
    if blocked:
        return max(blocked, key=lambda d: d.retry_after)
    decided = [d for d in decisions if d.decided]
    if not decided:
        return decisions[0]
    return min(decided, key=lambda d: (d.remaining, -(d.reset_after or 0.0)))


@functools.lru_cache(maxsize=256)
def _policy_name(name: str) -> str:
    return "".join(c for c in name if 0x20 <= ord(c) < 0x7F and c not in '"\\') or "default"


@functools.lru_cache(maxsize=1024)
def _policy_item(name: str, quota: int, window: int, weighted: bool) -> str:
    unit = ';qu="requests"' if weighted else ""
    return f'"{name}";q={quota}{unit};w={window}'


def _put(response: HttpResponse, headers: list[tuple[str, str]]) -> None:
    """Set headers we built: ASCII only (policy names are filtered to printable ASCII),
    so Django's per-header charset and newline checks are skipped when its header store
    is the plain dict it has been since Django 3.2."""
    store = getattr(response.headers, "_store", None)
    if type(store) is dict:
        for name, value in headers:
            store[_LOWER.get(name) or name.lower()] = (name, value)
    else:
        for name, value in headers:
            response[name] = value


_LOWER = {name: name.lower() for name in (
    "RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining",
    "RateLimit-Reset")}
_legacy_on: tuple[object, bool] = (None, True)  # (settings object, its LEGACY_HEADERS)


def _legacy_headers() -> bool:
    """``RATELIMIT['LEGACY_HEADERS']``, read once per settings object."""
    global _legacy_on
    config, on = _legacy_on
    current = get_config()
    if config is not current:
        on = bool(current.feature("RATELIMIT")["LEGACY_HEADERS"])
        _legacy_on = (current, on)  # one assignment: threads see a consistent pair
    return on


def add_headers(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Put the rate-limit headers of every decision made for ``request`` on ``response``."""
    decisions: list[Decision] | None = getattr(request, DECISIONS_ATTR, None)
    if not decisions or 300 <= response.status_code < 400:
        return response
    if len(decisions) == 1:  # the common case: each value built once
        decision = decisions[0]
        name = _policy_name(decision.name)
        policy = ("RateLimit-Policy", _policy(name, decision))
        if not decision.decided:
            _put(response, [policy])
            return response
        remaining = str(decision.remaining)
        reset = str(whole_seconds(decision.reset_after or 0.0))
        headers = [policy, ("RateLimit", f'"{name}";r={remaining};t={reset}'
                                         f";pk=:{decision.partition}:")]
        if _legacy_headers():
            headers += [("RateLimit-Limit", str(decision.limit)),
                        ("RateLimit-Remaining", remaining), ("RateLimit-Reset", reset)]
        _put(response, headers)
        return response
    policies, states, used = [], [], set()
    for decision in decisions:
        name = base = _policy_name(decision.name)
        n = 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        policies.append(_policy(name, decision))
        if decision.decided:
            states.append(_state(name, decision))
    headers = [("RateLimit-Policy", ", ".join(policies))]
    if states:
        headers.append(("RateLimit", ", ".join(states)))
        if _legacy_headers():
            headers += _legacy(binding([d for d in decisions if d.decided]))
    _put(response, headers)
    return response


def _policy(name: str, decision: Decision) -> str:
    rate = decision.policy
    quota, window = (rate.limit, rate.period) if rate else (decision.limit, 0)
    return _policy_item(name, quota, window, decision.cost != 1)


def _state(name: str, decision: Decision) -> str:
    return (f'"{name}";r={decision.remaining};t={whole_seconds(decision.reset_after or 0.0)}'
            f";pk=:{decision.partition}:")


def _legacy(decision: Decision) -> list[tuple[str, str]]:
    return [("RateLimit-Limit", str(decision.limit)),
            ("RateLimit-Remaining", str(decision.remaining)),
            ("RateLimit-Reset", str(whole_seconds(decision.reset_after or 0.0)))]
