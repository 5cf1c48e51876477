"""Sessions when Redis is unusable: Redis down means 503 and the session cookie left alone.

Each test runs the session engine on a throwaway redis-server that it kills or pauses,
through Django's real ``SessionMiddleware`` and ``AuthenticationMiddleware``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from django_redispatterns.sessions import user_sessions
from tests import urls_sessions
from tests.compat import requires_django_5
from tests.redis_servers import KEY_PREFIX, RedisServer

INNER = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
OUTER = [INNER[1], INNER[0], INNER[2]]
WITHOUT = [INNER[0], INNER[2]]

pytestmark = [pytest.mark.django_db, pytest.mark.topology, pytest.mark.urls("tests.urls_sessions")]


@pytest.fixture(params=["inner", "outer"])
def server(redis_server_factory: Callable[..., RedisServer],
           request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A throwaway Redis for the sessions; the middleware after or above SessionMiddleware."""
    node = redis_server_factory()
    config = {"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX, "SOCKET_TIMEOUT": 0.5,
              "SOCKET_CONNECT_TIMEOUT": 0.5, "SESSIONS": {"CONNECTION": node.url}}
    middleware = INNER if request.param == "inner" else OUTER
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions",
                           MIDDLEWARE=middleware, REDIS_PATTERNS=config):
        yield node
    urls_sessions.during_view.clear()
    if node.process is not None and node.process.poll() is None:
        node.resume()
        client = node.client()
        for key in client.scan_iter(match=f"{KEY_PREFIX}:*"):  # house rule I1 on this server too
            assert client.pttl(key) > 0, key


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user(username="alice", password="pw")


def signed_in() -> Client:
    client = Client(raise_request_exception=False)
    assert client.post("/login/", {"username": "alice", "password": "pw"}).status_code == 200
    return client


def assert_cookie_untouched(response: Any) -> None:
    assert "sessionid" not in response.cookies, response.cookies.output()


def test_redis_killed_answers_503_and_keeps_the_cookie(
    server: RedisServer, alice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = signed_in()
    cookie = client.cookies["sessionid"].value
    server.kill()
    with caplog.at_level(logging.WARNING, logger="django_redispatterns.sessions"):
        response = client.get("/whoami/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "session_store_unavailable"
    assert_cookie_untouched(response)
    assert client.cookies["sessionid"].value == cookie
    assert "session store unavailable" in caplog.text


def test_paused_redis_503_then_the_user_is_still_signed_in(
    server: RedisServer, alice: Any
) -> None:
    client = signed_in()
    server.pause()
    started = time.monotonic()
    response = client.get("/whoami/")
    elapsed = time.monotonic() - started
    server.resume()
    assert response.status_code == 503
    assert_cookie_untouched(response)
    assert elapsed < 10  # bounded by SOCKET_TIMEOUT, not hanging
    response = client.get("/whoami/")
    assert response.status_code == 200
    assert response.json()["user"] == "alice"  # no lost session


def test_redis_dying_before_the_save_answers_503_and_keeps_the_cookie(
    server: RedisServer, alice: Any
) -> None:
    client = signed_in()
    urls_sessions.during_view.append(server.kill)  # after the load, before the save
    response = client.get("/write/new-value/")
    assert response.status_code == 503
    assert_cookie_untouched(response)


def test_login_during_an_outage_is_503(server: RedisServer, alice: Any) -> None:
    client = Client(raise_request_exception=False)
    client.get("/write/x/")  # an anonymous session with a cookie
    server.kill()
    response = client.post("/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 503
    assert_cookie_untouched(response)


def test_anonymous_requests_without_a_cookie_never_touch_redis(
    server: RedisServer, alice: Any
) -> None:
    server.kill()
    response = Client().get("/whoami/")
    assert response.status_code == 200
    assert response.json()["user"] is None


def test_without_the_middleware_it_is_a_500_but_the_cookie_still_stays(
    server: RedisServer, alice: Any
) -> None:
    cookie = signed_in().cookies["sessionid"].value
    server.kill()
    with override_settings(MIDDLEWARE=WITHOUT):
        client = Client(raise_request_exception=False)  # a new handler: new middleware
        client.cookies["sessionid"] = cookie
        response = client.get("/whoami/")
    assert response.status_code == 500
    assert_cookie_untouched(response)


def test_password_change_succeeds_when_redis_is_down(
    server: RedisServer, alice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(REDIS_PATTERNS={
        "CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX, "SOCKET_TIMEOUT": 0.5,
        "SOCKET_CONNECT_TIMEOUT": 0.5,
        "SESSIONS": {"CONNECTION": server.url, "LOGOUT_ON_PASSWORD_CHANGE": True},
    }):
        server.kill()
        alice.set_password("new")
        with caplog.at_level(logging.ERROR, logger="django_redispatterns.sessions"):
            alice.save()
    alice.refresh_from_db()
    assert alice.check_password("new")
    assert "not revoked" in caplog.text


def test_index_operations_during_an_outage_raise_backend_unavailable(
    server: RedisServer, alice: Any
) -> None:
    from django_redispatterns.exceptions import BackendUnavailable
    from django_redispatterns.sessions import logout_everywhere, revoke_session

    server.kill()
    with pytest.raises(BackendUnavailable):
        user_sessions(alice)
    with pytest.raises(BackendUnavailable):
        logout_everywhere(alice)
    with pytest.raises(BackendUnavailable):
        revoke_session(alice, "0" * 32)


@pytest.mark.django_db(transaction=True)  # the async view reads users from another thread
def test_async_stack_503_and_recovery(server: RedisServer, alice: Any) -> None:
    """The middleware in an async handler (AsyncClient): same 503, same cookie, same user."""
    import asyncio

    from django.test import AsyncClient

    cookie = signed_in().cookies["sessionid"].value

    async def scenario() -> tuple[Any, Any]:
        client = AsyncClient(raise_request_exception=False)
        client.cookies["sessionid"] = cookie
        server.pause()
        try:
            down = await client.get("/whoami/")
        finally:
            server.resume()
        return down, await client.get("/whoami/")

    down, up = asyncio.run(scenario())
    assert down.status_code == 503
    assert_cookie_untouched(down)
    assert up.status_code == 200 and up.json()["user"] == "alice"


def test_save_every_request_with_an_untouched_session_is_one_503(server: RedisServer,
                                                                 alice: Any) -> None:
    """SESSION_SAVE_EVERY_REQUEST makes SessionMiddleware read a session no view touched."""
    client = signed_in()
    server.kill()
    with override_settings(SESSION_SAVE_EVERY_REQUEST=True):
        response = client.get("/untouched/")
    assert response.status_code == 503
    assert_cookie_untouched(response)


def test_a_revocation_during_the_request_is_still_djangos_400(server: RedisServer,
                                                              alice: Any) -> None:
    client = signed_in()
    response = client.get("/revoked-while-running/")
    assert response.status_code == 400  # SessionInterrupted, in either position


@requires_django_5
def test_native_async_engine_during_an_outage(server: RedisServer, alice: Any) -> None:
    import asyncio

    from django_redispatterns.exceptions import BackendUnavailable
    from django_redispatterns.sessions import SessionStore

    key = SessionStore()._get_new_session_key()
    server.kill()

    async def scenario() -> None:
        store = SessionStore(key)
        with pytest.raises(BackendUnavailable):
            await store.aload()
        assert store.session_key == key  # kept: the cookie is not dropped
        with pytest.raises(BackendUnavailable):
            await SessionStore().asave()

    asyncio.run(scenario())


# --- the 503 page: content negotiation, one warning, no "Internal Server Error" ----------

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def _problems_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records at WARNING or above from Django and from this app, logged by this thread
    (the test client's request; not another test's leftover background threads)."""
    import threading

    return [r for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("django")
            and r.thread == threading.get_ident()]


def _assert_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    records = _problems_logged(caplog)
    shown = [(r.name, r.levelname, r.getMessage()) for r in records]
    assert [r.levelno for r in records] == [logging.WARNING], shown
    assert records[0].name == "django_redispatterns.sessions", shown
    assert records[0].exc_info is None, shown
    assert not [r for r in caplog.records if r.name == "django.request"], shown


def test_a_browser_login_during_an_outage_gets_an_html_page_and_one_warning(
    server: RedisServer, alice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client(raise_request_exception=False)
    client.get("/write/x/")  # an anonymous session with a cookie
    cookie = client.cookies["sessionid"].value
    server.kill()
    with caplog.at_level(logging.DEBUG):
        response = client.post("/login/", {"username": "alice", "password": "pw"},
                               HTTP_ACCEPT=BROWSER_ACCEPT)
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert response["Retry-After"] == "5"
    assert response["Cache-Control"] == "no-store"
    assert b"<html" in response.content.lower()
    assert_cookie_untouched(response)
    assert client.cookies["sessionid"].value == cookie
    _assert_one_warning(caplog)


@pytest.mark.parametrize("accept", [None, "application/json", "application/problem+json",
                                    "*/*", "application/json, text/html;q=0.5"])
def test_api_clients_during_an_outage_get_problem_json_and_one_warning(
    server: RedisServer, alice: Any, caplog: pytest.LogCaptureFixture, accept: str | None
) -> None:
    client = signed_in()
    cookie = client.cookies["sessionid"].value
    server.kill()
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    with caplog.at_level(logging.DEBUG):
        response = client.get("/whoami/", **headers)
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "session_store_unavailable"
    assert_cookie_untouched(response)
    assert client.cookies["sessionid"].value == cookie
    _assert_one_warning(caplog)


def test_the_503_page_is_an_overridable_template(
    server: RedisServer, alice: Any, tmp_path: Any
) -> None:
    from django.conf import settings

    page = tmp_path / "redispatterns" / "sessions_unavailable.html"
    page.parent.mkdir()
    page.write_text("<html><body>Back in {{ retry_after }} seconds, ours</body></html>")
    templates = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    client = signed_in()
    server.kill()
    with override_settings(TEMPLATES=templates):
        response = client.get("/whoami/", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert response.status_code == 503
    assert b"Back in 5 seconds, ours" in response.content
    assert_cookie_untouched(response)


def test_redis_dying_before_the_save_is_one_warning_too(
    server: RedisServer, alice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = signed_in()
    urls_sessions.during_view.append(server.kill)  # after the load, before the save
    with caplog.at_level(logging.DEBUG):
        response = client.get("/write/new-value/", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert_cookie_untouched(response)
    _assert_one_warning(caplog)
