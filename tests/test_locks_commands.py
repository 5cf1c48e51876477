"""@single_flight / @locked on real management commands, and the `locks` operator command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redispatterns.exceptions import LockLost
from django_redispatterns.locks import Lock, held_key
from tests.redis_servers import KEY_PREFIX
from tests.testapp.management.commands.locktest_run import RUNS_KEY

ROOT = Path(__file__).resolve().parent.parent


def manage(redis_url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def runs(client: redis.Redis) -> list[list[str]]:
    return [e.decode().split() for e in client.lrange(RUNS_KEY, 0, -1)]


RELEASE_KEY = f"{KEY_PREFIX}:locktest:go"


def start_both(redis_url: str, client: redis.Redis, *args: str,
               hold: bool = False) -> list[subprocess.Popen[str]]:
    """Start two runs; the second only once the first is inside its lock.

    With ``hold`` the first keeps its lock until :func:`let_go` (the second has finished),
    so a slow process start on a loaded machine cannot change the outcome.
    """
    extra = ("--hold-until", RELEASE_KEY) if hold else ()
    first = manage(redis_url, "locktest_run", *args, *extra)
    deadline = time.monotonic() + 30
    while not runs(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs(client), "first run never started"
    return [first, manage(redis_url, "locktest_run", *args)]


def let_go(client: redis.Redis) -> None:
    client.set(RELEASE_KEY, 1, ex=60)


def test_single_flight_command_from_two_processes(redis_client: redis.Redis,
                                                  redis_url: str) -> None:
    procs = start_both(redis_url, redis_client, "single", "--sleep", "0", hold=True)
    code2, out2, err2 = finish(procs[1])
    let_go(redis_client)
    code1, out1, err1 = finish(procs[0])
    assert code1 == 0 and "ran with fencing token" in out1, err1
    assert code2 == 0, err2  # skipped, yet exit status 0
    assert out2 == ""
    assert err2.strip().count("\n") == 0 and "skipped" in err2 and "locktest-run" in err2
    assert [e[0] for e in runs(redis_client)] == ["start", "end"]  # the body ran once
    fence = int(runs(redis_client)[0][2])
    assert fence > 0


def test_locked_command_waits_then_runs_after_the_first(redis_client: redis.Redis,
                                                        redis_url: str) -> None:
    procs = start_both(redis_url, redis_client, "locked", "--sleep", "1.5", "--wait", "20")
    results = [finish(p) for p in procs]
    assert all(code == 0 for code, _, _ in results), results
    events = runs(redis_client)
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # never overlapping
    assert float(events[1][1]) <= float(events[2][1])
    assert int(events[2][2]) > int(events[0][2])  # the second run's fencing token is higher


def test_locked_command_without_wait_fails_with_command_error(redis_client: redis.Redis,
                                                              redis_url: str) -> None:
    procs = start_both(redis_url, redis_client, "locked", "--sleep", "0", hold=True)
    code2, _, err2 = finish(procs[1])
    let_go(redis_client)
    code1, _, err1 = finish(procs[0])
    assert code1 == 0, err1
    assert code2 == 1
    assert "CommandError" in err2 and "locktest-run" in err2 and "Traceback" not in err2
    assert [e[0] for e in runs(redis_client)] == ["start", "end"]


def test_single_flight_default_name_is_the_command_name(redis_client: redis.Redis) -> None:
    out, err = StringIO(), StringIO()
    with Lock("locktest_default", ttl=5):
        assert call_command("locktest_default", stdout=out, stderr=err) is None
    assert out.getvalue() == "" and "skipped" in err.getvalue()
    out = StringIO()
    call_command("locktest_default", stdout=out)
    assert out.getvalue().startswith("fencing token ")
    assert int(out.getvalue().split()[-1]) > 0


def test_command_reports_a_lost_lease(redis_client: redis.Redis) -> None:
    from django.core.management.base import BaseCommand

    from django_redispatterns.locks import locked

    class Command(BaseCommand):
        @locked(name="probe", ttl=0.6)
        def handle(self, *args: Any, **options: Any) -> None:
            redis_client.delete(held_key("probe"))
            assert Lock("probe", ttl=5, auto_renew=False).acquire()
            deadline = time.monotonic() + 3
            while not self.lock.lost and time.monotonic() < deadline:
                time.sleep(0.05)

    with pytest.raises(CommandError, match="lost") as info:
        Command().handle()
    assert isinstance(info.value.__cause__, LockLost)


# --- operator command -------------------------------------------------------------------


def test_locks_list_shows_owner_ttl_and_fencing_token(redis_client: redis.Redis) -> None:
    out = StringIO()
    call_command("locks", "list", stdout=out)
    assert out.getvalue().strip() == "no locks held"
    with Lock("nightly", ttl=20, owner="nightly_report") as lock, \
            Lock("odd name {x}", ttl=20, namespace="reports"):
        out = StringIO()
        call_command("locks", "list", stdout=out)
        lines = out.getvalue().strip().splitlines()
        assert lines[0].split("\t") == ["name", "owner", "ttl_s", "fencing_token", "token"]
        rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
        _, owner, ttl, fence, token = rows["nightly"]
        assert "(nightly_report)" in owner and str(os.getpid()) in owner
        assert 0 < float(ttl) <= 20
        assert int(fence) == lock.fencing_token and token == lock.token
        assert "odd name {x}" in rows
        out = StringIO()
        call_command("locks", "list", "--namespace", "reports", stdout=out)
        assert "nightly\t" not in out.getvalue() and "odd name {x}" in out.getvalue()


def test_locks_force_release(redis_client: redis.Redis) -> None:
    with pytest.raises(LockLost), Lock("stuck", ttl=0.6) as lock:
        with pytest.raises(CommandError, match="--force"):
            call_command("locks", "release", "stuck")
        assert lock.owned()
        out = StringIO()
        call_command("locks", "release", "stuck", "--force", stdout=out)
        assert "released 'stuck'" in out.getvalue()
        assert not redis_client.exists(held_key("stuck"))
        deadline = time.monotonic() + 3
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.05)
    with pytest.raises(CommandError, match="not held"):
        call_command("locks", "release", "stuck", "--force")
