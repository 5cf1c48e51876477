"""The devices page in a real headless browser: Playwright drives the system's Chromium
(``/usr/bin/chromium``, or ``$CHROMIUM``; no browser download) against pytest-django's
live server, the real session engine and the real test Redis.

Skipped, saying why, when Playwright is not installed or no Chromium can be found
(``.ci/run`` installs Debian's ``chromium`` package when it is missing).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.test import override_settings

from django_redispatterns.sessions import SessionStore, session_handle, user_sessions
from tests.test_devices import MIDDLEWARE, SAFARI_IPHONE, data_key

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the live server reads users from its thread
    pytest.mark.usefixtures("redis_client"),
    pytest.mark.urls("tests.urls_devices"),
]

WINDOWS_EDGE = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like "
                "Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0.2210.91")


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "chromium",
                      "chromium-browser"):
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    return None


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium found: install Debian's chromium package "
                    "(apt-get install chromium) or set CHROMIUM to its path")
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls
    # are ordinary synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(autouse=True)
def _engine() -> Iterator[None]:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions", MIDDLEWARE=MIDDLEWARE):
        yield


@pytest.fixture
def live_server(_engine: None, transactional_db: None) -> Iterator[Any]:
    """pytest-django's live server, started inside this module's settings.

    (Its session-wide ``live_server`` fixture builds its handler, and so its middleware and
    session engine, when first used, before any test's settings apply.)
    """
    from pytest_django.live_server_helper import LiveServer

    server = LiveServer("localhost")
    try:
        yield server
    finally:
        server.stop()


def sign_in(browser: Any, base: str, agent: str) -> Any:
    """A new browser context (a device of its own) signed in as alice; its page."""
    context = browser.new_context(user_agent=agent)
    context.set_default_timeout(30_000)  # generous: the machine is shared and slow
    page = context.new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "pw-alice")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/account/devices/")
    return page


def session_cookie(page: Any) -> str:
    (value,) = [c["value"] for c in page.context.cookies() if c["name"] == "sessionid"]
    return str(value)


def test_two_devices_see_each_other_and_one_ends_the_other(
        browser: Any, live_server: Any, redis_client: redis.Redis) -> None:
    user = get_user_model().objects.create_user(username="alice", password="pw-alice")
    base = live_server.url
    laptop = sign_in(browser, base, WINDOWS_EDGE)
    phone = sign_in(browser, base, SAFARI_IPHONE)
    phone_key = session_cookie(phone)

    laptop.reload()
    assert laptop.locator("section.device").count() == 2
    current = laptop.locator("section.device.current")
    assert "Edge 120 on Windows" in current.inner_text()
    assert "This device" in current.inner_text()
    other = laptop.locator(f'section.device[data-device="{session_handle(phone_key)}"]')
    assert "Safari 17 on iOS 17" in other.inner_text()
    assert phone_key not in laptop.content() and session_cookie(laptop) not in laptop.content()

    other.get_by_role("button", name="Sign out this device").click()
    laptop.wait_for_url(f"{base}/account/devices/?ended=1")
    assert laptop.locator("section.device").count() == 1
    assert "1 device was signed out." in laptop.inner_text("main")
    # The phone's session is really gone from Redis, not just hidden.
    assert not redis_client.exists(data_key(user, phone_key))
    assert not SessionStore().exists(phone_key)
    assert [s.handle for s in user_sessions(user)] == [session_handle(session_cookie(laptop))]
    phone.goto(f"{base}/account/devices/")
    assert "/accounts/login/" in phone.url  # signed out: sent to the login page

    # Two more devices, then "Sign out all other devices" from the laptop.
    tablets = [sign_in(browser, base, f"tablet-{i}") for i in range(2)]
    laptop.reload()
    assert laptop.locator("section.device").count() == 3
    laptop.get_by_role("button", name="Sign out all other devices").click()
    laptop.wait_for_url(f"{base}/account/devices/?ended=2")
    assert laptop.locator("section.device").count() == 1
    for tablet in tablets:
        assert not SessionStore().exists(session_cookie(tablet))
        tablet.goto(f"{base}/account/devices/")
        assert "/accounts/login/" in tablet.url
    laptop.reload()
    assert "This device" in laptop.inner_text("main")  # still signed in
