"""The example project's cache page renders and works (in a child process, since the
example has its own settings module)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, raw_client

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import re
import django
from django.test.utils import setup_test_environment
django.setup()
setup_test_environment()
from django.db import connection
connection.creation.create_test_db(verbosity=0)
from django.core.cache import cache, caches
from django.test import Client

from django_redispatterns.cache import RedisCache
assert isinstance(caches["default"], RedisCache), type(caches["default"])
cache.delete_many(["demo:report:eu", "demo:report:computes"])

def computes(page):
    return int(re.search(rb"<strong>(\d+)</strong>", page.content).group(1))

client = Client()
first = client.get("/cache/")
assert first.status_code == 200 and b"Stampede-safe cache" in first.content
assert b"is not <code>django_redispatterns" not in first.content
assert computes(first) == 1
# The page tells the fresh part of the lifetime from the stale window kept after it.
fresh = int(re.search(rb"fresh for</th><td>(\d+) s", first.content).group(1))
assert 25 <= fresh <= 30, fresh
assert b"then kept stale for" in first.content and b"STALE_TTL</code> = 30 s" in first.content
assert computes(client.get("/cache/")) == 1  # cached: not computed again
assert client.post("/cache/", {"action": "expire"}).status_code == 302
assert computes(client.get("/cache/")) == 2
assert client.post("/cache/", {"action": "stampede"}).status_code == 302
result = client.get("/cache/").content
ours, plain = re.findall(rb'class="(?:ok|bad)">(\d+)<', result)
assert int(ours) == 1 and int(plain) > 1, (ours, plain)
print("ok", int(plain))
'''


def test_cache_demo_page(redis_server_factory: Callable[..., RedisServer]) -> None:
    # A server of its own: the example project writes under its own prefixes, not the tests'.
    redis_url = redis_server_factory().url
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    client = raw_client(redis_url)
    for key in client.scan_iter(match="demo-cache:*"):  # the example's cache KEY_PREFIX
        assert client.pttl(key) > 0, key
        client.delete(key)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    assert re.match(r"ok \d+", result.stdout.strip().splitlines()[-1])
