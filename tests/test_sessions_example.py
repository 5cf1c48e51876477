"""The example project's "Your sessions" page renders and works (in a child process, since
it has its own settings module)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, raw_client

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import django
from django.test.utils import setup_test_environment
django.setup()
setup_test_environment()
from django.db import connection
connection.creation.create_test_db(verbosity=0)
from django.core.management import call_command
from django.test import Client

call_command("create_demo_user", stdout=open("/dev/null", "w"))
anonymous = Client().get("/sessions/")
assert anonymous.status_code == 200 and b"create_demo_user" in anonymous.content
assert Client().get("/accounts/login/").status_code == 200
devices = []
for agent in ("Firefox on Linux", "Safari on iPhone", "Chrome on Windows"):
    client = Client(HTTP_USER_AGENT=agent)
    login = client.post("/accounts/login/", {"username": "demo", "password": "demo-password"})
    assert login.status_code == 302, login.status_code
    devices.append(client)
page = devices[0].get("/sessions/").content.decode()
assert "this device" in page and "Safari on iPhone" in page and page.count("Sign out</button>") == 2
assert 'href="/account/devices/"' in page
listed = devices[0].get("/account/devices/").content.decode()
assert "all patterns" in listed  # the demo's own layout (its devices_base.html override)
assert listed.count('class="device') == 3 and listed.count("This device") == 1
assert "Safari on iPhone" in listed
from django.contrib import admin
from django.contrib.auth import get_user_model
from django_redispatterns.contrib.devices.admin import logout_everywhere_action
assert logout_everywhere_action in admin.site._registry[get_user_model()].actions
done = devices[0].post("/sessions/", {"action": "others"}, follow=True).content.decode()
assert "Signed out 2 other session(s)." in done, done
assert b"Sign in" in devices[1].get("/sessions/").content
assert devices[0].post("/accounts/logout/?next=/sessions/").status_code == 302

# The admin action, on Django's own UserAdmin (added by the devices app).
from django.contrib.auth.models import Permission
def signed_in(username, password):
    client = Client()
    assert client.post("/accounts/login/", {"username": username, "password": password}
                       ).status_code == 302
    return client
User = get_user_model()
User.objects.create_superuser("boss", password="boss-password")
viewer = User.objects.create_user("viewer", password="viewer-password", is_staff=True)
viewer.user_permissions.add(Permission.objects.get(codename="view_user"))
demo_devices = [signed_in("demo", "demo-password") for _ in range(2)]
boss, watcher = signed_in("boss", "boss-password"), signed_in("viewer", "viewer-password")
assert "logout_everywhere_action" in boss.get("/admin/auth/user/").content.decode()
seen = watcher.get("/admin/auth/user/")
assert seen.status_code == 200 and "logout_everywhere_action" not in seen.content.decode()
demo = User.objects.get(username="demo")
done = boss.post("/admin/auth/user/", {"action": "logout_everywhere_action",
                                       "_selected_action": [demo.pk]}, follow=True)
assert "Logged out 1 user(s) everywhere (2 session(s) ended)." in done.content.decode()
assert all(b"Sign in" in d.get("/sessions/").content for d in demo_devices)
assert boss.get("/admin/auth/user/").status_code == 200  # the admin stays signed in
print("ok")
'''


def test_your_sessions_page(redis_server_factory: Callable[..., RedisServer]) -> None:
    # A server of its own: the example project writes under its own prefixes, not the tests'.
    redis_url = redis_server_factory().url
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    client = raw_client(redis_url)
    for key in client.scan_iter(match="demo:*"):  # the example's KEY_PREFIX
        assert client.pttl(key) > 0, key
        client.delete(key)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    assert result.stdout.strip().endswith("ok")
