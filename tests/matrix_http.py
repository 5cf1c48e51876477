"""Fault-matrix entry points reached over HTTP: middleware (sync and async), view
decorators and the DRF throttle (tests/test_fault_matrix.py runs them)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.test import AsyncClient, Client

from tests import urls_matrix
from tests.matrix_faults import MIDDLEWARE_BASE, Cell, app_on, entry, returned

RATELIMIT_MW = "django_redispatterns.middleware.RateLimitMiddleware"
IDEMPOTENCY_MW = "django_redispatterns.middleware.IdempotencyMiddleware"
SESSIONS = [
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
JSON = {"Accept": "application/json"}


# Sync rows that share a view (fail open and fail closed) count apart: another client
# address (async rows use views and rules of their own).
OPEN_IP, CLOSED_IP = "192.0.2.1", "192.0.2.2"


def get(path: str, client: Client | None = None, ip: str = OPEN_IP, **headers: str) -> Any:
    client = client or Client(raise_request_exception=False, REMOTE_ADDR=ip)
    return client.get(path, headers=headers or JSON)


def aget(path: str, client: AsyncClient | None = None, **headers: str) -> Any:
    client = client or AsyncClient(raise_request_exception=False)
    return asyncio.run(client.get(path, headers=headers or JSON))


# --- rate limits: fail open, an undecided decision, no header claiming a count ---------


def _rule(path: str, name: str | None = None) -> dict[str, Any]:
    return {"RATELIMIT": {"RULES": [{"path": f"^/{path}/", "rate": urls_matrix.RATE,
                                     "key": "ip", "algorithm": "fixed_window",
                                     "name": name or path}]}}


def _check_rate_limited(cell: Cell, send: Any) -> None:
    assert send().json()["decided"] is True  # counted once before the fault
    response = returned(cell.during(send))
    assert response.status_code == 200, response.content  # never a 500, never a 503
    body = response.json()
    if cell.healthy_answer:
        # the script was reloaded and ran once: the second hit of this client's budget
        assert body == {"decided": True, "remaining": 998, "limited": False}
        assert response["RateLimit"]
        return
    assert body == {"decided": False, "remaining": None, "limited": False}
    assert "RateLimit" not in response  # no invented count (RateLimit-Policy only)


def _check_fail_closed(cell: Cell, send: Any) -> None:
    """``FAIL_OPEN = False``: 503 + ``Retry-After: 1`` where Redis cannot decide."""
    assert send().json()["decided"] is True
    response = returned(cell.during(send))
    if cell.healthy_answer:
        assert response.status_code == 200 and response.json()["remaining"] == 998
        return
    assert response.status_code == 503, response.content  # never a 500
    assert response["Retry-After"] == "1"
    assert "RateLimit" not in response


def _http(cell: Cell, middleware: list[str], path: str, asynchronous: bool,
          fail_open: bool = True, **patterns: Any) -> None:
    if not fail_open:
        patterns = {"RATELIMIT": {**patterns.get("RATELIMIT", {}), "FAIL_OPEN": False}}
    with app_on(cell.server, [*middleware, *MIDDLEWARE_BASE], **patterns):
        ip = OPEN_IP if fail_open else CLOSED_IP
        send = ((lambda: aget(f"/{path}/")) if asynchronous
                else (lambda: get(f"/{path}/", ip=ip)))
        (_check_rate_limited if fail_open else _check_fail_closed)(cell, send)


@entry("ratelimit_middleware", "ratelimit")
def ratelimit_middleware(cell: Cell) -> None:
    _http(cell, [RATELIMIT_MW], "rl-mw", False, **_rule("rl-mw"))


@entry("ratelimit_middleware_async", "ratelimit")
def ratelimit_middleware_async(cell: Cell) -> None:
    _http(cell, [RATELIMIT_MW], "rl-mw-async", True, **_rule("rl-mw-async"))


@entry("ratelimit_decorator", "ratelimit")
def ratelimit_decorator(cell: Cell) -> None:
    _http(cell, [], "rl-dec", False)


@entry("ratelimit_decorator_async", "ratelimit")
def ratelimit_decorator_async(cell: Cell) -> None:
    _http(cell, [], "rl-dec-async", True)


@entry("ratelimit_middleware_fail_closed", "ratelimit")
def ratelimit_middleware_fail_closed(cell: Cell) -> None:
    _http(cell, [RATELIMIT_MW], "rl-mw", False, False, **_rule("rl-mw"))


@entry("ratelimit_middleware_async_fail_closed", "ratelimit")
def ratelimit_middleware_async_fail_closed(cell: Cell) -> None:
    _http(cell, [RATELIMIT_MW], "rl-mw-async", True, False,
          **_rule("rl-mw-async", "rl-mw-async-closed"))


@entry("ratelimit_decorator_fail_closed", "ratelimit")
def ratelimit_decorator_fail_closed(cell: Cell) -> None:
    _http(cell, [], "rl-dec", False, False)


@entry("ratelimit_decorator_async_fail_closed", "ratelimit")
def ratelimit_decorator_async_fail_closed(cell: Cell) -> None:
    _http(cell, [], "rl-dec-async-closed", True, False)


def _drf(cell: Cell, fail_open: bool) -> None:
    from rest_framework.settings import api_settings

    api_settings.reload()
    try:
        with app_on(cell.server, RATELIMIT={"FAIL_OPEN": fail_open}):
            send = lambda: get("/drf/", ip=OPEN_IP if fail_open else CLOSED_IP)  # noqa: E731
            assert send().json()["decided"] is True
            response = returned(cell.during(send))
            if cell.healthy_answer:
                assert response.status_code == 200
                assert response.json() == {"decided": True, "remaining": 998}
            elif fail_open:
                assert response.status_code == 200, response.content
                assert response.json() == {"decided": False, "remaining": None}
            else:
                assert response.status_code == 503, response.content
                assert response["Retry-After"] == "1"
                assert response.json()["detail"]
    finally:
        api_settings.reload()


@entry("drf_throttle", "ratelimit")
def drf_throttle(cell: Cell) -> None:
    _drf(cell, fail_open=True)


@entry("drf_throttle_fail_closed", "ratelimit")
def drf_throttle_fail_closed(cell: Cell) -> None:
    _drf(cell, fail_open=False)


# --- idempotency: fail closed, 503 + Retry-After, the view does not run ---------------


def _idempotent(cell: Cell, middleware: list[str], path: str, runs: str,
                asynchronous: bool) -> None:
    def post(key: str) -> Any:
        headers = {"Idempotency-Key": key, **JSON}
        if asynchronous:
            return asyncio.run(AsyncClient(raise_request_exception=False).post(
                f"/{path}/", headers=headers))
        return Client(raise_request_exception=False).post(f"/{path}/", headers=headers)

    with app_on(cell.server, [*MIDDLEWARE_BASE, *middleware]):
        assert post(f"{path}-before").status_code == 201
        ran = urls_matrix.RUNS[runs]
        response = returned(cell.during(lambda: post(f"{path}-during")))
        if cell.healthy_answer:
            assert response.status_code == 201 and urls_matrix.RUNS[runs] == ran + 1
            replay = post(f"{path}-during")
            assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
            assert replay.content == response.content and urls_matrix.RUNS[runs] == ran + 1
            return
        assert response.status_code == 503, response.content
        assert int(response["Retry-After"]) >= 1
        assert response.json()["code"] == "idempotency_unavailable"
        assert urls_matrix.RUNS[runs] == ran  # the view did not run


@entry("idempotency_middleware", "idempotency")
def idempotency_middleware(cell: Cell) -> None:
    _idempotent(cell, [IDEMPOTENCY_MW], "idem-mw", "charge", False)


@entry("idempotency_middleware_async", "idempotency")
def idempotency_middleware_async(cell: Cell) -> None:
    _idempotent(cell, [IDEMPOTENCY_MW], "idem-mw-async", "acharge", True)


@entry("idempotency_replay", "idempotency")
def idempotency_replay(cell: Cell) -> None:
    """A retry of a request that already ran: the stored answer is a read."""
    def post() -> Any:
        return Client(raise_request_exception=False).post(
            "/idem-mw/", headers={"Idempotency-Key": "replay-me", **JSON})

    with app_on(cell.server, [*MIDDLEWARE_BASE, IDEMPOTENCY_MW]):
        first = post()
        assert first.status_code == 201
        ran = urls_matrix.RUNS["charge"]
        response = returned(cell.during(post))
        assert urls_matrix.RUNS["charge"] == ran  # never a second run
        if cell.down:
            assert response.status_code == 503 and int(response["Retry-After"]) >= 1
            return
        # served by a full Redis or a replica too: the same answer, byte for byte
        assert response.status_code == 201, response.content
        assert response["Idempotent-Replayed"] == "true"
        assert response.content == first.content


@entry("idempotent_decorator", "idempotency")
def idempotent_decorator(cell: Cell) -> None:
    _idempotent(cell, [], "idem-dec", "charge_decorated", False)


# --- sessions: 503 + Retry-After, the cookie untouched, the session intact after --------


def _session(cell: Cell, asynchronous: bool, accept: str) -> Any:
    """The session's second visit sent during the fault; returns its response."""
    with app_on(cell.server, [*SESSIONS, *MIDDLEWARE_BASE]):
        browser = Client(raise_request_exception=False)
        assert get("/sess/", browser).json() == {"n": 1}
        cookie = browser.cookies["sessionid"].value
        if asynchronous:
            abrowser = AsyncClient(raise_request_exception=False)
            abrowser.cookies = browser.cookies
            response = returned(cell.during(
                lambda: aget("/sess-async/", abrowser, Accept=accept)))
        else:
            response = returned(cell.during(lambda: get("/sess/", browser, Accept=accept)))
        if cell.healthy_answer:
            assert response.status_code == 200 and response.json() == {"n": 2}
            assert response.cookies["sessionid"].value == cookie  # saved, same session
            return response
        assert "sessionid" not in response.cookies, response.cookies.output()
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == "5"
        if cell.fault != "refused":  # (restarted without persistence: the data is gone)
            # Redis is back: the same cookie, the same session, where it was
            assert get("/sess/", browser).json() == {"n": 2}
            assert browser.cookies["sessionid"].value == cookie
        return response


def _api_503(cell: Cell, response: Any) -> None:
    if not cell.healthy_answer:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "session_store_unavailable"


@entry("session_middleware", "sessions")
def session_middleware(cell: Cell) -> None:
    _api_503(cell, _session(cell, False, "application/json"))


@entry("session_middleware_async", "sessions")
def session_middleware_async(cell: Cell) -> None:
    _api_503(cell, _session(cell, True, "application/json"))


@entry("session_middleware_browser", "sessions")
def session_middleware_browser(cell: Cell) -> None:
    """A browser (``Accept: text/html``) gets a page it can show, not raw JSON."""
    response = _session(cell, False, "text/html,application/xhtml+xml,*/*;q=0.8")
    if not cell.healthy_answer:
        assert response["Content-Type"].startswith("text/html"), response["Content-Type"]
