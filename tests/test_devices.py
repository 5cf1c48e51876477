"""The "Your devices" pages and the "Log out everywhere" admin action, through the test client
against the real test Redis (one client per device)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import Client, RequestFactory, override_settings

from django_redispatterns.contrib.devices.admin import (
    add_logout_everywhere_action,
    logout_everywhere_action,
)
from django_redispatterns.contrib.devices.useragent import parse_user_agent
from django_redispatterns.sessions import SessionStore, session_handle, user_sessions, user_tag
from tests.redis_servers import KEY_PREFIX
from tests.test_sessions_index import MIDDLEWARE, cookie

PAGE = "/account/devices/"
FIREFOX_LINUX = "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0"
SAFARI_IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 "
                 "(KHTML, like Gecko) Version/17.2 Mobile/15E148 Safari/604.1")



class UserAdmin(admin.ModelAdmin):  # (django.contrib.auth.admin needs the admin app installed)
    actions: list[Any] = []


pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("redis_client"),
    pytest.mark.urls("tests.urls_devices"),
]


@pytest.fixture(autouse=True)
def _engine() -> Iterator[None]:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions", MIDDLEWARE=MIDDLEWARE):
        yield


def make_user(name: str = "alice") -> Any:
    return get_user_model().objects.create_user(username=name, password=f"pw-{name}")


def device(name: str = "alice", agent: str = FIREFOX_LINUX, **extra: Any) -> Client:
    client = Client(HTTP_USER_AGENT=agent, REMOTE_ADDR="203.0.113.77", **extra)
    response = client.post("/login/", {"username": name, "password": f"pw-{name}"})
    assert response.status_code == 200, response.content
    return client


def data_key(user: Any, client_or_key: Client | str) -> str:
    key = client_or_key if isinstance(client_or_key, str) else cookie(client_or_key)
    return f"{KEY_PREFIX}:sess:{{{user_tag(str(user.pk))}}}:s:{session_handle(key)}"


def handles_on_page(html: str) -> list[str]:
    return re.findall(r'data-device="([0-9a-f]{32})"', html)


# --- the page -------------------------------------------------------------------------


def test_page_lists_each_device_with_browser_system_ip_times_and_marks_this_one() -> None:
    make_user()
    laptop, phone = device(agent=FIREFOX_LINUX), device(agent=SAFARI_IPHONE)
    response = laptop.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Firefox 121 on Linux" in html and "Safari 17 on iOS 17" in html
    assert "phone" in html and "desktop" in html
    assert "203.0.113.0/24" in html  # the IP as stored (truncated by default)
    assert html.count("This device") == 1
    assert handles_on_page(html) == [session_handle(cookie(laptop)), session_handle(cookie(phone))]
    assert html.count("<time") == 4  # created and last activity of both
    current = re.search(r'class="device current" data-device="(\w+)"', html)
    assert current and current.group(1) == session_handle(cookie(laptop))
    assert response["Cache-Control"].startswith("max-age=0")


def test_the_page_never_contains_a_session_key() -> None:
    make_user()
    laptop, phone = device(), device(agent=SAFARI_IPHONE)
    html = laptop.get(PAGE).content.decode()
    for key in (cookie(laptop), cookie(phone)):
        assert key not in html
        assert key[32:] not in html  # not even the secret half


def test_end_one_device_deletes_that_session_in_redis(redis_client: redis.Redis) -> None:
    user = make_user()
    laptop, phone = device(), device(agent=SAFARI_IPHONE)
    phone_key = cookie(phone)
    assert redis_client.exists(data_key(user, phone_key))
    response = laptop.post(f"{PAGE}end/", {"device": session_handle(phone_key)})
    assert response.status_code == 302 and response["Location"] == f"{PAGE}?ended=1"
    assert not redis_client.exists(data_key(user, phone_key))
    assert not SessionStore().exists(phone_key)
    assert phone.get("/whoami/").json()["user"] is None
    html = laptop.get(response["Location"]).content.decode()
    assert handles_on_page(html) == [session_handle(cookie(laptop))]
    assert "1 device was signed out." in html


def test_end_all_other_devices_keeps_this_one(redis_client: redis.Redis) -> None:
    user = make_user()
    laptop = device()
    others = [device(agent=f"agent-{i}") for i in range(3)]
    response = laptop.post(f"{PAGE}end-others/")
    assert response.status_code == 302 and response["Location"] == f"{PAGE}?ended=3"
    assert [s.handle for s in user_sessions(user)] == [session_handle(cookie(laptop))]
    assert all(not redis_client.exists(data_key(user, c)) for c in others)
    assert laptop.get("/whoami/").json()["user"] == "alice"
    assert "Sign out all other devices" not in laptop.get(PAGE).content.decode()


def test_ending_this_device_signs_it_out() -> None:
    make_user()
    laptop, phone = device(), device(agent=SAFARI_IPHONE)
    key = cookie(laptop)
    response = laptop.post(f"{PAGE}end/", {"device": session_handle(key)})
    assert response.status_code == 302
    assert laptop.get("/whoami/").json()["user"] is None
    assert not SessionStore().exists(key)
    assert phone.get("/whoami/").json()["user"] == "alice"


def test_a_handle_of_another_users_session_ends_nothing(redis_client: redis.Redis) -> None:
    make_user("alice"), make_user("bob")
    mallory, victim = device("alice"), device("bob")
    response = mallory.post(f"{PAGE}end/", {"device": session_handle(cookie(victim))})
    assert response["Location"] == f"{PAGE}?ended=0"
    assert victim.get("/whoami/").json()["user"] == "bob"


@pytest.mark.parametrize("value", ["", "nothex", "A" * 32, "0" * 31, "0" * 64])
def test_a_malformed_handle_is_a_400(value: str) -> None:
    make_user()
    assert device().post(f"{PAGE}end/", {"device": value}).status_code == 400


def test_signed_out_visitors_are_sent_to_the_login_page() -> None:
    anonymous = Client()
    for method, url in (("get", PAGE), ("post", f"{PAGE}end/"), ("post", f"{PAGE}end-others/")):
        response = getattr(anonymous, method)(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/?next=")


def test_the_forms_need_a_csrf_token() -> None:
    make_user()
    laptop, phone = device(enforce_csrf_checks=True), device()
    html = laptop.get(PAGE).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token
    handle = session_handle(cookie(phone))
    assert laptop.post(f"{PAGE}end/", {"device": handle}).status_code == 403
    assert laptop.post(f"{PAGE}end-others/").status_code == 403
    assert phone.get("/whoami/").json()["user"] == "alice"
    response = laptop.post(f"{PAGE}end/", {"device": handle, "csrfmiddlewaretoken": token[1]})
    assert response.status_code == 302
    assert phone.get("/whoami/").json()["user"] is None


def test_list_accepts_get_only_and_actions_post_only() -> None:
    make_user()
    laptop = device()
    assert laptop.post(PAGE).status_code == 405
    assert laptop.get(f"{PAGE}end/").status_code == 405
    assert laptop.get(f"{PAGE}end-others/").status_code == 405


def test_a_project_overrides_the_templates(tmp_path: Path, settings: Any) -> None:
    (tmp_path / "redispatterns").mkdir()
    (tmp_path / "redispatterns" / "devices_device.html").write_text(
        "<li class=mine>{{ device.browser }}|{{ device.handle }}</li>")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    make_user()
    laptop = device()
    html = laptop.get(PAGE).content.decode()
    assert f"<li class=mine>Firefox 121|{session_handle(cookie(laptop))}</li>" in html
    assert "<h1>Your devices</h1>" in html  # the rest is still the shipped page


# --- user agents ----------------------------------------------------------------------

AGENTS = [
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36", "Chrome 120", "Windows", "desktop"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36 Edg/120.0.2210.91", "Edge 120", "Windows", "desktop"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like "
     "Gecko) Version/17.2 Safari/605.1.15", "Safari 17", "macOS", "desktop"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36 OPR/106.0.0.0", "Opera 106", "macOS", "desktop"),
    (FIREFOX_LINUX, "Firefox 121", "Linux", "desktop"),
    (SAFARI_IPHONE, "Safari 17", "iOS 17", "phone"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, "
     "like Gecko) CriOS/120.0.6099.119 Mobile/15E148 Safari/604.1", "Chrome 120", "iOS 17",
     "phone"),
    ("Mozilla/5.0 (iPad; CPU OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "FxiOS/121.0 Mobile/15E148 Safari/605.1.15", "Firefox 121", "iPadOS 16", "tablet"),
    ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.6099.144 Mobile Safari/537.36", "Chrome 120", "Android 14", "phone"),
    ("Mozilla/5.0 (Linux; Android 13; SM-X700) AppleWebKit/537.36 (KHTML, like Gecko) "
     "SamsungBrowser/23.0 Chrome/115.0.0.0 Safari/537.36", "Samsung Internet 23",
     "Android 13", "tablet"),
    ("Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36", "Chrome 120", "ChromeOS", "desktop"),
    ("Mozilla/5.0 (Windows NT 6.1; Trident/7.0; rv:11.0) like Gecko", "Internet Explorer 11",
     "Windows 7", "desktop"),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "HeadlessChrome/120.0.0.0 Safari/537.36", "Chrome 120", "Linux", "desktop"),
    ("curl/8.5.0", "curl 8", "Unknown system", "unknown"),
    ("python-requests/2.31.0", "Python requests 2", "Unknown system", "unknown"),
    ("", "Unknown browser", "Unknown system", "unknown"),
    ("\x00" * 5000, "Unknown browser", "Unknown system", "unknown"),
]


@pytest.mark.parametrize(("agent", "browser", "system", "kind"), AGENTS)
def test_user_agents_of_the_common_browsers_and_systems(agent: str, browser: str, system: str,
                                                        kind: str) -> None:
    parsed = parse_user_agent(agent)
    assert (parsed.browser, parsed.os, parsed.device) == (browser, system, kind)


# --- the admin action -----------------------------------------------------------------


def admin_request(user: Any) -> Any:
    request = RequestFactory().post("/admin/auth/user/")
    request.user = user
    request._messages = CookieStorage(request)
    return request


def messages_of(request: Any) -> list[str]:
    return [str(m) for m in request._messages._queued_messages]


def test_admin_action_logs_the_selected_users_out_everywhere() -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    clients = [device("alice"), device("alice"), device("bob"), device("carol")]
    staff = make_user("staff")
    staff.is_staff = True
    staff.save()
    staff.user_permissions.add(Permission.objects.get(codename="change_user"))
    staff = get_user_model().objects.get(pk=staff.pk)  # fresh permission cache
    site = admin.AdminSite()
    site.register(get_user_model(), UserAdmin)
    assert add_logout_everywhere_action(site)
    model_admin = site._registry[get_user_model()]
    request = admin_request(staff)
    assert "logout_everywhere_action" in model_admin.get_actions(request)
    queryset = get_user_model().objects.filter(pk__in=[alice.pk, bob.pk])
    logout_everywhere_action(model_admin, request, queryset)
    assert messages_of(request) == ["Logged out 2 user(s) everywhere (3 session(s) ended)."]
    assert [c.get("/whoami/").json()["user"] for c in clients] == [None, None, None, "carol"]
    assert user_sessions(carol) and not user_sessions(alice)


def test_admin_action_is_offered_only_to_staff_who_may_change_users() -> None:
    make_user("alice")
    victim = device("alice")
    staff = make_user("staff")
    staff.is_staff = True
    staff.save()
    site = admin.AdminSite()
    site.register(get_user_model(), UserAdmin)
    add_logout_everywhere_action(site)
    model_admin = site._registry[get_user_model()]
    request = admin_request(staff)
    assert "logout_everywhere_action" not in model_admin.get_actions(request)
    logout_everywhere_action(model_admin, request, get_user_model().objects.all())
    assert messages_of(request) == ["You are not allowed to log users out."]
    assert victim.get("/whoami/").json()["user"] == "alice"


def test_adding_the_action_keeps_the_projects_own_admin_and_actions() -> None:
    def own_action(modeladmin: Any, request: Any, queryset: Any) -> None:
        pass

    class ProjectUserAdmin(admin.ModelAdmin):
        actions = [own_action]

    site = admin.AdminSite()
    assert not add_logout_everywhere_action(site)  # not registered: nothing to change
    site.register(get_user_model(), ProjectUserAdmin)
    assert add_logout_everywhere_action(site) and add_logout_everywhere_action(site)
    model_admin = site._registry[get_user_model()]
    assert type(model_admin) is ProjectUserAdmin
    assert model_admin.actions == [own_action, logout_everywhere_action]
    assert ProjectUserAdmin.actions == [own_action]


# --- Redis unreachable ----------------------------------------------------------------


def test_the_page_and_the_actions_answer_503_when_the_index_cannot_be_reached(
        caplog: Any) -> None:
    """Sessions kept elsewhere (Django's database engine) while the index's Redis is down:
    the page cannot list, and says so with a 503 instead of an error page."""
    from tests import settings as base

    down = {**base.REDIS_PATTERNS, "SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5,
            "SESSIONS": {"CONNECTION": "redis://127.0.0.1:1/0"}}
    with override_settings(SESSION_ENGINE="django.contrib.sessions.backends.db",
                           MIDDLEWARE=MIDDLEWARE[1:], REDIS_PATTERNS=down):
        client = Client()
        client.force_login(make_user())
        for method, url, data in (("get", PAGE, {}), ("post", f"{PAGE}end/", {"device": "0" * 32}),
                                  ("post", f"{PAGE}end-others/", {})):
            response = getattr(client, method)(url, data)
            assert response.status_code == 503, url
            assert response["Retry-After"] == "5"
            assert "cannot be listed or signed out right now" in response.content.decode()
    assert "session store unavailable" in caplog.text
