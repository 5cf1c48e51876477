"""What every operator command shares: one line when Redis fails, no secrets, no escapes.

Each command (``locks``, ``idempotency``, ``sessions``, ``ratelimit``, ``redis_audit``) is
run against a refused and a hung server (SIGSTOP), through a URL with a password: it must
answer with one line naming the server (password redacted) and the failure, exit status 1,
within a bounded time. Stored text that reaches the terminal (user agents, key names, lock
owners) is printed with its control characters escaped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from tests.redis_servers import KEY_PREFIX, RedisServer

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "hunter2-very-secret"
BOUND = 10.0  # seconds any command may take against a dead or hung server
Factory = Callable[..., RedisServer]
# Raw control characters that must never reach the terminal (tab and newline are layout).
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

HOSTILE = "\x1b[2J\x1b]0;pwned\x07evil\rFAKE\u202eLINE"

COMMANDS: list[tuple[str, ...]] = [
    ("locks", "list"),
    ("locks", "release", "payroll", "--force"),
    ("idempotency", "count"),
    ("idempotency", "show", "--scope", "tenant:a", "order-1"),
    ("idempotency", "delete", "--scope", "tenant:a", "order-1"),
    ("sessions", "list", "operator"),
    ("sessions", "revoke", "operator"),
    ("ratelimit", "inspect", "--identity", "198.51.100.1", "--rate", "5/m", "--group", "g"),
    ("ratelimit", "reset", "--identity", "198.51.100.1", "--rate", "5/m", "--group", "g"),
    ("redis_audit",),
]


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("operator", password="x")


@pytest.fixture
def protected(redis_server_factory: Factory) -> RedisServer:
    """A throwaway server that wants a password (set once it is up)."""
    server = redis_server_factory()
    server.client().config_set("requirepass", PASSWORD)
    return server


def url_of(server: RedisServer) -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


@pytest.fixture
def on_server(protected: RedisServer) -> Iterator[RedisServer]:
    """Every feature on ``protected`` (password in the URL), 0.5 s socket timeouts."""
    patterns = {"CONNECTION": url_of(protected), "KEY_PREFIX": KEY_PREFIX,
                "SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5}
    with override_settings(REDIS_PATTERNS=patterns,
                           SESSION_ENGINE="django_redispatterns.sessions"):
        yield protected


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def assert_one_line_naming(exc: CommandError, server: RedisServer, started: float) -> None:
    took = time.monotonic() - started
    text = str(exc)
    assert took < BOUND, f"took {took:.1f}s"
    assert exc.returncode == 1
    assert "\n" not in text.strip(), text
    assert f"127.0.0.1:{server.port}" in text, text
    assert PASSWORD not in text and "***" in text, text
    assert not RAW_CONTROL.search(text)


@pytest.mark.django_db
@pytest.mark.parametrize("fault", ["refused", "hung"])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_says_in_one_line_which_server_failed(
    args: tuple[str, ...], fault: str, on_server: RedisServer, operator: Any,
) -> None:
    if fault == "refused":
        on_server.kill()
    else:
        on_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(CommandError) as info:
            run(*args)
        assert_one_line_naming(info.value, on_server, started)
    finally:
        if fault == "hung":
            on_server.resume()


def test_a_dead_redis_is_one_line_on_stderr_and_exit_status_1(
    protected: RedisServer, tmp_path: Path,
) -> None:
    """From the shell, as an operator sees it: no traceback, one line, status 1."""
    (tmp_path / "dead_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        f"REDIS_PATTERNS = {{'CONNECTION': {url_of(protected)!r}, 'KEY_PREFIX': '{KEY_PREFIX}',"
        " 'SOCKET_TIMEOUT': 0.5, 'SOCKET_CONNECT_TIMEOUT': 0.5}\n")
    protected.kill()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "dead_settings",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for args in (("locks", "list"), ("idempotency", "count"), ("redis_audit",)):
        proc = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert f"127.0.0.1:{protected.port}" in lines[0] and PASSWORD not in proc.stderr


# --- secrets and terminal escapes in output ---------------------------------------------------


def test_redis_audit_prints_the_url_without_its_password(on_server: RedisServer) -> None:
    out = run("redis_audit")
    assert PASSWORD not in out
    assert f"redis://:***@127.0.0.1:{on_server.port}/0" in out
    assert PASSWORD not in run("redis_audit", "--json")


@pytest.mark.allow_no_ttl
def test_redis_audit_escapes_control_characters_in_key_names(on_server: RedisServer) -> None:
    client = redis.Redis(port=on_server.port, password=PASSWORD)
    client.set(f"evil:{HOSTILE}".encode(), 1)  # no TTL: listed with its name
    client.set(b"bytes:\xff\x1b[31m", 1, ex=60)
    for out in (run("redis_audit"), run("redis_audit", "--json")):
        assert not RAW_CONTROL.search(out), repr(out)
    assert "\\x1b[2J" in run("redis_audit")


@pytest.mark.django_db
def test_sessions_list_escapes_a_stored_user_agent(on_server: RedisServer, operator: Any) -> None:
    middleware = ["django_redispatterns.middleware.SessionActivityMiddleware",
                  "django.contrib.sessions.middleware.SessionMiddleware",
                  "django.contrib.auth.middleware.AuthenticationMiddleware"]
    with override_settings(MIDDLEWARE=middleware, ROOT_URLCONF="tests.urls_faults"):
        browser = Client(HTTP_USER_AGENT=HOSTILE)
        browser.force_login(operator)
        assert browser.get("/sess/").status_code == 200
    out = run("sessions", "list", "operator")
    assert "1 live session(s)" in out
    assert not RAW_CONTROL.search(out), repr(out)
    assert "\\x1b[2J" in out and "evil\\x0dFAKE" in out


def test_locks_list_escapes_a_hostile_lock_name(on_server: RedisServer) -> None:
    from django_redispatterns.locks import Lock

    with Lock(f"job{HOSTILE}", ttl=30):
        out = run("locks", "list")
    assert not RAW_CONTROL.search(out), repr(out)
    assert "job\\x1b[2J" in out


def test_an_unsupported_url_is_refused_without_its_password() -> None:
    with pytest.raises(CommandError) as info:
        run("redis_audit", "--connection", f"memcached://admin:{PASSWORD}@127.0.0.1:11211")
    assert PASSWORD not in str(info.value) and "***" in str(info.value)


# --- idempotency --user: a primary key or a username, as for sessions -------------------


@pytest.mark.django_db
def test_idempotency_user_accepts_a_username_or_a_primary_key(
    on_server: RedisServer, operator: Any, django_user_model: Any,
) -> None:
    from django_redispatterns.idempotency import IdempotencyStore
    from django_redispatterns.idempotency.store import Fingerprint

    numeric = django_user_model.objects.create_user(str(operator.pk + 1000), password="x")
    store = IdempotencyStore(url_of(on_server))
    for user in (operator, numeric):
        scope = f"user:{user.pk}"
        store.begin(scope, "order-1", Fingerprint.of("POST", "/o", "", "", b""), lease=30)
        by_pk = json.loads(run("idempotency", "show", "--user", str(user.pk), "order-1"))
        by_name = json.loads(run("idempotency", "show", "--user", user.get_username(),
                                 "order-1"))
        assert by_pk["redis_key"] == by_name["redis_key"] and by_pk["state"]
    with pytest.raises(CommandError, match="no user"):
        run("idempotency", "show", "--user", "nobody", "order-1")
