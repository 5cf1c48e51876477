"""Least privilege against a real server with real ACL users: the line ``manage.py
redis_acl`` prints, applied, is enough for every feature and no broader; the deploy check
names a missing right exactly, says nothing where the right exists, and never crashes.
Each test runs on a throwaway server of its own (``redis_server_factory``)."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.management import call_command
from django.test import override_settings

from django_redispatterns import checks, connection
from django_redispatterns.checks import rights
from django_redispatterns.checks.project import load_config
from django_redispatterns.idempotency import Fingerprint, IdempotencyStore, StoredResponse
from django_redispatterns.locks import Lock
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.sessions import SessionStore
from tests.redis_servers import CACHE_PREFIX, KEY_PREFIX, RedisServer

Factory = Callable[..., RedisServer]
OUR_ENGINE = "django_redispatterns.sessions"
FEATURES = {"LOCKS": {}, "RATELIMIT": {}, "IDEMPOTENCY": {}}


def settings_for(url: str, near: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {"SOCKET_TIMEOUT": 2}
    if near:
        options["NEAR_CACHE"] = {"MAX_ENTRIES": 100}
    entry = {"BACKEND": "django_redispatterns.cache.RedisCache", "LOCATION": url,
             "KEY_PREFIX": CACHE_PREFIX, "TIMEOUT": 300, "OPTIONS": options}
    return {"CACHES": {"default": entry}, "SESSION_ENGINE": OUR_ENGINE,
            "REDIS_PATTERNS": {"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX, **FEATURES}}


@pytest.fixture
def server(redis_server_factory: Factory) -> Iterator[RedisServer]:
    yield redis_server_factory("--maxmemory", "64mb", "--maxmemory-policy", "noeviction",
                               "--save", "3600 1")


def printed_rule(url: str, user: str = "app", near: bool = False) -> str:
    out = io.StringIO()
    with override_settings(**settings_for(url, near)):
        call_command("redis_acl", "--all", "--user", user, stdout=out)
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("#")]
    assert len(lines) == 1, out.getvalue()
    return lines[0]


def apply(server: RedisServer, line: str, password: str = "pw",
          drop: str | None = None) -> str:
    """Create the user ``line`` describes (placeholder password replaced), optionally
    without the right ``drop``; the user's URL."""
    words = line.replace("><password>", f">{password}").split()
    assert words[:2] == ["ACL", "SETUSER"]
    if drop is not None:
        assert drop in words, (drop, words)
        words.remove(drop)
    server.client().execute_command(*words)
    return f"redis://{words[2]}:{password}@127.0.0.1:{server.port}/0"


@pytest.fixture
def as_user() -> Iterator[Callable[[str, bool], None]]:
    stack: list[Any] = []

    def use(url: str, near: bool = False) -> None:
        stack.append(override_settings(**settings_for(url, near)))
        stack[-1].enable()
        connection.reset_clients()

    yield use
    for item in reversed(stack):
        item.disable()
    connection.reset_clients()


def use_every_feature() -> None:
    cache = caches["default"]
    cache.set("a", 1, 30)
    assert cache.get("a") == 1
    assert cache.get_or_set("b", lambda: "made", 30) == "made"
    assert cache.incr("a") == 2
    assert cache.touch("a", 60) and cache.ttl("a") > 0
    assert cache.keys("*") and cache.delete("b")
    cache.clear()
    with Lock("acl-lock", ttl=5):
        pass
    assert Lock("acl-lock", ttl=5).acquire(wait=1)
    assert RateLimiter("5/m", group="acl").hit("someone").allowed
    assert RateLimiter("5/m", group="acl-s", algorithm="sliding_window").hit("x").allowed
    store = IdempotencyStore("default")
    fingerprint = Fingerprint.of("POST", "/pay/", "", "application/json", b"{}")
    claim = store.begin("user:1", "k", fingerprint, lease=5)
    store.complete(claim, StoredResponse(201, (), b"ok"), fingerprint, ttl=60)  # type: ignore[arg-type]
    session = SessionStore()
    session["a"] = "b"
    session.save()
    assert SessionStore(session.session_key).load() == {"a": "b"}
    session.delete()


def test_the_printed_rule_is_enough_for_every_feature(server: RedisServer,
                                                      as_user: Any) -> None:
    line = printed_rule(server.url)
    assert line.startswith("ACL SETUSER app reset on ><password> ")
    assert f"~{CACHE_PREFIX}:*" in line and f"~{KEY_PREFIX}:lock:*" in line
    as_user(apply(server, line))
    use_every_feature()


def test_the_printed_rule_is_no_broader_than_needed(server: RedisServer) -> None:
    client = redis.Redis.from_url(apply(server, printed_rule(server.url)))
    for refused in (("CONFIG", "GET", "maxmemory"), ("KEYS", "*"), ("FLUSHALL",),
                    ("FLUSHDB",), ("DEBUG", "SLEEP", "0"), ("MONITOR",),
                    ("CLIENT", "KILL", "ID", "1"), ("GET", "someone-else:key"),
                    ("SET", f"{KEY_PREFIX}-elsewhere", "1"), ("SCRIPT", "FLUSH")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*refused)


@pytest.mark.parametrize("drop", ["+evalsha", "+blpop", "+scan", "+unlink"])
def test_each_right_is_needed_and_a_missing_one_is_one_exact_warning(
        server: RedisServer, drop: str) -> None:
    url = apply(server, printed_rule(server.url), drop=drop)
    with override_settings(**settings_for(url)):
        messages = checks.check_redis_servers()
    warnings = [m for m in messages if m.id == "redispatterns.W021"]
    command = drop[1:].upper()
    users = sorted(need.feature for need in rights.needs(
        load_config()[0], {"locks": "default", "rate limits": "default",
                                  "idempotency records": "default", "sessions": "default"},
        {"default": {"KEY_PREFIX": CACHE_PREFIX}}) if command in need.commands)
    assert [m.msg for m in warnings] == [
        f"Redis at 127.0.0.1:{server.port}: the user may not run {command}, needed by "
        f"{feature}." for feature in users]
    assert "redis_acl" in warnings[0].hint


def test_the_right_rule_gives_no_warning_and_only_reads(server: RedisServer) -> None:
    url = apply(server, printed_rule(server.url))
    admin = server.client()
    admin.config_resetstat()
    with override_settings(**settings_for(url)):
        messages = checks.check_redis_servers()
    assert sorted(m.id for m in messages) == ["redispatterns.I001", "redispatterns.I002"]
    ran = {name for name, stat in admin.info("commandstats").items() if stat["calls"]}
    assert ran <= {"cmdstat_" + c for c in (
        "hello", "auth", "client|setinfo", "info", "ping", "multi", "discard", "exec",
        "watch", "unwatch", "config|resetstat")}, ran  # auth: redis-py 5.0 logs in with AUTH
    assert admin.dbsize() == 0


def test_a_key_pattern_outside_the_rule_is_named(server: RedisServer) -> None:
    line = printed_rule(server.url).replace(f"~{KEY_PREFIX}:lock:*", "")
    with override_settings(**settings_for(apply(server, line))):
        warnings = [m.msg for m in checks.check_redis_servers()
                    if m.id == "redispatterns.W021"]
    assert warnings == [
        f"Redis at 127.0.0.1:{server.port}: the user may not run EVALSHA, EVAL, BLPOP, DEL, "
        "EXISTS, GET, LPUSH, LTRIM, MGET, PEXPIRE, PTTL, SET, needed by locks."]


def test_no_multi_right_is_named_and_an_unknown_answer_is_info(server: RedisServer) -> None:
    url = apply(server, printed_rule(server.url), drop="+multi")
    with override_settings(**settings_for(url)):
        warnings = [m.msg for m in checks.check_redis_servers()
                    if m.id == "redispatterns.W021"]
    assert any("may not run MULTI" in w for w in warnings), warnings

    server.client().execute_command("ACL", "SETUSER", "app", "+multi")
    with override_settings(**settings_for(url)), pytest.MonkeyPatch.context() as patch:
        # a server that answers MULTI with something else than OK or NOPERM
        patch.setattr(sys.modules["django_redispatterns.checks.targets"], "probe_rights",
                      lambda client, need: None)
        messages = checks.check_redis_servers()
    assert [m.id for m in messages if m.id.endswith(("W021", "I003"))] == [
        "redispatterns.I003"]


def test_near_cache_needs_tracking_and_its_channel(server: RedisServer, as_user: Any) -> None:
    line = printed_rule(server.url, near=True)
    assert "&__redis__:invalidate" in line and "+client|tracking" in line
    as_user(apply(server, line), near=True)
    cache = caches["default"]
    cache.set("n", 1, 30)
    deadline = time.monotonic() + 10
    while cache.get("n") != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.get("n") == 1
    url = apply(server, line.replace("&__redis__:invalidate", ""), password="pw2")
    with override_settings(**settings_for(url, near=True)):
        warnings = [m.msg for m in checks.check_redis_servers()
                    if m.id == "redispatterns.W021"]
    assert warnings == [f"Redis at 127.0.0.1:{server.port}: the user may not run SUBSCRIBE, "
                        "needed by cache 'default'."]


def test_the_command_never_prints_a_password(server: RedisServer) -> None:
    url = f"redis://app:hunter2@127.0.0.1:{server.port}/0"
    line = printed_rule(url)
    assert "hunter2" not in line and "><password>" in line


def test_the_security_page_lists_exactly_what_each_feature_sends() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    for commands in (rights.CACHE, rights.NEAR_CACHE, rights.LOCKS, rights.RATELIMIT,
                     rights.IDEMPOTENCY, rights.SESSIONS, rights.SENTINEL, rights.CACHE_EXTRAS):
        assert f"`{' '.join('+' + c.lower() for c in sorted(commands))}`" in page


def test_operator_commands_as_the_app_user_on_a_locked_down_server(
        server: RedisServer, as_user: Any) -> None:
    url = apply(server, printed_rule(server.url))
    server.client().set("someone-else:key", "x")  # a key the app user may not read
    as_user(url)
    caches["default"].set("a", 1, 30)
    Lock("acl-audit", ttl=30).acquire()
    out = io.StringIO()
    call_command("redis_audit", stdout=out)
    call_command("locks", "list", stdout=out)
    text = out.getvalue()
    assert "Keys without a TTL: none among those this Redis user may read.\n" in text
    assert ("  1 keys were not checked: this Redis user may not read them (ACL key patterns); "
            "audit as a user that may read every key.\n") in text
    assert "acl-audit" in text and "Traceback" not in text


def test_the_session_rule_holds_every_command_of_the_session_scripts() -> None:
    """Moving a session from the previous engine (session_adopt.lua) checks the key's TYPE:
    Redis checks a script's calls against the caller's rights, so the rule must hold it."""
    import re

    called = set()
    for script in (Path(__file__).resolve().parent.parent / "lua").glob("session_*.lua"):
        called |= {c.upper() for c in re.findall(r"redis\.p?call\('(\w+)'", script.read_text())}
    assert called - set(rights.SESSIONS) == set()


@pytest.mark.parametrize("near", [False, True])
def test_sessions_in_process_memory_need_tracking_and_its_channel(near: bool) -> None:
    from django_redispatterns.conf import build_config

    config = build_config({"KEY_PREFIX": KEY_PREFIX, "SESSIONS": {"NEAR_CACHE": near}})
    (sessions,) = rights.needs(config, {"sessions": "default"}, {})
    assert ("CLIENT|TRACKING" in sessions.commands) is near
    assert sessions.channels == (("__redis__:invalidate",) if near else ())
