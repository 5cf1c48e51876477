"""The example project's tasks page: a @locked task enqueued once per key writes the
statement row with its fencing token; a busy lock and a full rate are reported (in a child
process: the example has its own settings module)."""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec

import pytest

from tests.redis_servers import RedisServer
from tests.test_example_pages import PRELUDE, run_example

if find_spec("django.tasks") is None:  # built in from Django 6.0, else the backport
    pytest.importorskip("django_tasks", reason="the tasks extra (django-tasks) is not installed")

SCRIPT = PRELUDE + r'''
assert 'href="/tasks/"' in client.get("/").content.decode()
first = client.post("/tasks/", {"action": "once", "account": "acme", "key": "k1"}).content.decode()
assert "SUCCESSFUL: returned" in first, first
token = int(re.search(r"<th>fencing token</th><td><code>(\d+)</code>", first).group(1))
again = client.post("/tasks/", {"action": "once", "account": "acme", "key": "k1"}).content.decode()
assert "was used already" in again and "not enqueued again" in again, again
assert f"<code>{token}</code>" in again, "a repeated key ran the task again"
other = client.post("/tasks/", {"action": "once", "account": "acme", "key": "k2"}).content.decode()
newer = int(re.search(r"<th>fencing token</th><td><code>(\d+)</code>", other).group(1))
assert newer > token, (newer, token)
busy = client.post("/tasks/", {"action": "busy", "account": "acme"}).content.decode()
assert "FAILED: LockNotAcquired" in busy, busy
sent = client.post("/tasks/", {"action": "send", "account": "acme"}).content.decode()
assert sent.count("SUCCESSFUL") == 2 and "FAILED: RateLimited" in sent, sent
print("ok")
'''


def test_tasks_page(redis_server_factory: Callable[..., RedisServer]) -> None:
    run_example(SCRIPT, redis_server_factory)
