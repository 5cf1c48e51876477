"""The example project's idempotency page works as it says (in a child process, since it
has its own settings module): a replay, a 422, and a receipt whose rendering fails after the
view returned, whose key is free again for the retry."""

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
import json
import django
from django.test.utils import setup_test_environment
django.setup()
setup_test_environment()
from django.db import connection
connection.creation.create_test_db(verbosity=0)
from django.test import Client

client = Client(raise_request_exception=False)
page = client.get("/idempotency/")
assert page.status_code == 200 and b"Receipt that fails to render" in page.content

def send(url, key, amount=100):
    return client.post(url, json.dumps({"amount": amount}), content_type="application/json",
                       headers={"Idempotency-Key": key})

first = send("/idempotency/pay/", "example-1")
again = send("/idempotency/pay/", "example-1")
assert first.status_code == again.status_code == 201, (first.status_code, again.status_code)
assert again["Idempotent-Replayed"] == "true" and again.content == first.content
assert send("/idempotency/pay/", "example-1", 999).status_code == 422
statuses = [send("/idempotency/receipt/", "example-2").status_code for _ in range(2)]
assert statuses == [500, 500], statuses  # the retry ran again: not 409
print("ok")
'''


def test_idempotency_page(redis_server_factory: Callable[..., RedisServer]) -> None:
    # A server of its own: the example project writes under its own prefixes, not the tests'.
    redis_url = redis_server_factory().url
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    client = raw_client(redis_url)
    for key in client.scan_iter(match="demo*"):  # the example's KEY_PREFIX and cache prefix
        assert client.pttl(key) > 0, key
        client.delete(key)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    assert result.stdout.strip().endswith("ok")
