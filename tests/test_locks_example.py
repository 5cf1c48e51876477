"""The example project's @single_flight command: a skipped run says so exactly once (in a
child process, since the example has its own settings module and logging setup)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

HOLD_THEN_RUN = r'''
import sys
import django
django.setup()
from django.core.management import call_command
from django_redispatterns.locks import Lock

holder = Lock("nightly_report", ttl=30, auto_renew=False, owner="another host")
assert holder.acquire()
try:
    call_command("nightly_report")  # the command's own stdout/stderr: this process's
finally:
    holder.release()
print("done", file=sys.stdout)
'''


def test_single_flight_skip_line_is_printed_once(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """The example logs django_redispatterns at INFO to the console: the skip line must
    still reach the terminal once, not once from the command and again from the log."""
    redis_url = redis_server_factory().url
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", HOLD_THEN_RUN], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    terminal = result.stdout + result.stderr
    assert terminal.count("skipped: 'nightly_report' is already running elsewhere") == 1, \
        terminal
    assert result.stdout.strip().splitlines()[-1] == "done"
