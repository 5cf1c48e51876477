"""The example project's checks and locks pages read like a product demo: levels beside
check ids, TTLs in human units, one time zone (in a child process: the example has its own
settings module)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = r'''
import re
import django
from django.test.utils import setup_test_environment
django.setup()
setup_test_environment()
from django.db import connection
connection.creation.create_test_db(verbosity=0)
from django.test import Client

client = Client()
'''

SCRIPT = PRELUDE + r'''
from django.core.cache import cache
cache.set("demo:long-lived", "x" * 5000, timeout=3 * 3600)
checks = client.get("/checks/").content.decode()
assert "<th>level</th><th>id</th><th>what it means</th>" in checks, checks
assert re.search(r"<td[^>]*>error</td>\s*<td><code>redispatterns\.E001</code>", checks), checks
assert not re.search(r"\d ms</td>", checks), "a raw millisecond TTL on the checks page"
assert re.search(r">\d h \d+ min</td>", checks), "the 3 h key's TTL is not in hours"

assert client.post("/locks/", {"action": "run"}).status_code == 200
locks = client.get("/locks/").content.decode()
body = re.search(r"report built at (\d{4}-\d\d-\d\d \d\d:\d\d):\d\d UTC", locks)
shown = re.search(r"<th>updated</th><td>(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d UTC</td>", locks)
assert body and shown, locks
assert body.group(1)[:13] == shown.group(1)[:13], (body.group(1), shown.group(1))
print("ok")
'''


def run_example(script: str, redis_server_factory: Callable[..., RedisServer]) -> None:
    """Run ``script`` against the example project in a child process; it prints "ok"."""
    redis_url = redis_server_factory().url  # a server of its own: the example's prefixes
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    assert result.stdout.strip().splitlines()[-1] == "ok"


def test_checks_and_locks_pages(redis_server_factory: Callable[..., RedisServer]) -> None:
    run_example(SCRIPT, redis_server_factory)
