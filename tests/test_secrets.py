"""No password, client key passphrase or URL with credentials in any log line, check message,
exception (its causes included), settings repr or operator command output — over TLS too.

Each scenario makes every feature, the checks and the operator commands fail against a
real server (a wrong password, an unreachable TLS host, a refused certificate) with a
distinctive password in the URL and an encrypted client key, and looks for both secrets
in everything that was printed, logged or raised.
"""

from __future__ import annotations

import io
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redispatterns import checks
from django_redispatterns.conf import build_config, get_config
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.idempotency import Fingerprint, IdempotencyStore
from django_redispatterns.locks import Lock
from django_redispatterns.ratelimit import RateLimiter
from tests.redis_servers import KEY_PREFIX, RedisServer, free_port
from tests.test_cache_support import make_cache
from tests.tls_servers import (
    KEY_PASSPHRASE,
    Certificates,
    TLSRedisServer,
)
from tests.topologies import wait_for

PASSWORD = "pw-5ecret-71c9d2"
SECRETS = (PASSWORD, KEY_PASSPHRASE)


@pytest.fixture
def scenario(request: pytest.FixtureRequest, tls_certs: Certificates,
             redis_server_factory: Callable[..., RedisServer]
             ) -> Iterator[tuple[str, dict[str, Any]]]:
    certs = tls_certs
    """(URL with PASSWORD, TLS settings with the encrypted key) that fail as named."""
    tls = certs.settings(encrypted=True)
    if request.param == "wrong password":
        server = redis_server_factory()
        server.client().config_set("requirepass", "the-right-one")
        yield f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0", tls
    elif request.param == "unreachable TLS host":
        yield f"rediss://:{PASSWORD}@127.0.0.1:{free_port()}/0", tls
    else:  # a refused certificate
        tls_server = TLSRedisServer(certs)
        yield tls_server.url.replace("://", f"://:{PASSWORD}@"), {
            **tls, "CA_CERTS": certs.path("other-ca.crt")}
        tls_server.stop()


def failure_text(call: Callable[[], Any]) -> str:
    """Everything ``call``'s failure shows: the exception and its causes, with tracebacks."""
    try:
        call()
    except BaseException as exc:  # any failure is what we look at
        return "".join(traceback.format_exception(exc))
    return ""


def command_text(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
    except CommandError as exc:
        return f"{out.getvalue()}{err.getvalue()}CommandError: {exc}"
    return out.getvalue() + err.getvalue()


@pytest.mark.parametrize("scenario", ["wrong password", "unreachable TLS host",
                                      "refused certificate"], indirect=True)
def test_no_secret_in_any_output(scenario: tuple[str, dict[str, Any]],
                                 caplog: pytest.LogCaptureFixture) -> None:
    url, tls = scenario
    caches = {"default": {"BACKEND": "django_redispatterns.cache.RedisCache",
                          "LOCATION": url, "TIMEOUT": 300,
                          "OPTIONS": {"SOCKET_TIMEOUT": 1, "SOCKET_CONNECT_TIMEOUT": 1}}}
    fingerprint = Fingerprint.of("POST", "/", "", "", b"")
    with override_settings(CACHES=caches, SESSION_ENGINE="django_redispatterns.sessions",
                           REDIS_PATTERNS={"CONNECTION": url, "KEY_PREFIX": KEY_PREFIX,
                                           "TLS": tls}):
        caplog.set_level(logging.DEBUG)
        from django_redispatterns.sessions import SessionStore

        failures = [failure_text(call) for call in (
            lambda: Lock("secret-lock", ttl=5).acquire(),
            lambda: RateLimiter("5/m", group="secrets").hit("who"),
            lambda: IdempotencyStore(url).begin("user:1", "k", fingerprint, lease=5),
            lambda: SessionStore().save(),
            lambda: make_cache(url).get("k"),
            lambda: make_cache(url, IGNORE_EXCEPTIONS=True).set("k", 1),
        )]
        messages = [*checks.check_redis_servers(), *run_checks()]
        commands = [command_text("redis_audit", "--connection", url),
                    command_text("locks", "list"),
                    command_text("ratelimit", "inspect", "--identity", "127.0.0.1", "--rate", "5/m",
                                 "--group", "g")]
        config = repr(get_config())
    shown = "\n".join([*failures, *(f"{m.msg} {m.hint}" for m in messages), *commands,
                       caplog.text, config])
    # Each path did fail, and showed the server it failed on (password masked).
    assert sum(bool(f) for f in failures) >= 4
    assert any(m.id in ("redispatterns.W010", "redispatterns.W030") for m in messages)
    assert all("CommandError: Redis at" in c and ":***@" in c for c in commands), commands
    for secret in SECRETS:
        assert secret not in shown


def test_near_cache_log_lines_never_name_the_password(
        redis_server_factory: Callable[..., RedisServer],
        caplog: pytest.LogCaptureFixture) -> None:
    server = redis_server_factory()
    server.client().config_set("requirepass", PASSWORD)
    url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
    cache = make_cache(url, NEAR_CACHE={})
    try:
        assert cache._near._start().wait_ready(10)
        caplog.set_level(logging.WARNING, logger="django_redispatterns")
        server.kill()
        wait_for(lambda: "invalidation channel lost" in caplog.text, 20,
                 "the near cache to report its lost channel")
    finally:
        cache._near.stop()
    assert f"127.0.0.1:{server.port}" in caplog.text  # the server is named...
    assert PASSWORD not in caplog.text  # ...without its password


def test_settings_errors_and_repr_never_show_secrets(tls_certs: Certificates) -> None:
    certs = tls_certs
    with pytest.raises(ConfigurationError) as info:
        build_config({"TLS": {**certs.settings(), "KEY_PASSWORD": KEY_PASSPHRASE.encode()}})
    assert str(info.value) == "REDIS_PATTERNS['TLS']['KEY_PASSWORD'] must be str or None, " \
                              "got bytes."
    with pytest.raises(ConfigurationError) as info:
        build_config({"CONNECTION": [f"redis://:{PASSWORD}@h:6379/0"]})
    assert PASSWORD not in str(info.value)
    config = build_config({"CONNECTION": f"redis://:{PASSWORD}@h:6379/0",
                           "LOCKS": {"QUORUM": [f"redis://:{PASSWORD}@h2:6379/0"]},
                           "TLS": certs.settings(encrypted=True)})
    assert "KEY_PASSWORD': '***'" in repr(config)
    for secret in SECRETS:
        assert secret not in repr(config)
