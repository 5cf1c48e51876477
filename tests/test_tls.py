"""Every feature over TLS, against real ``redis-server --tls-port`` processes that require a
client certificate, with a private CA made for this run (tests/tls_servers.py).

Certificate verification is on by default: a server whose certificate another CA signed,
or whose certificate names another host, is refused with redis-py's error naming why.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import override_settings

from django_redispatterns import checks, connection
from django_redispatterns.conf import build_config, get_config
from django_redispatterns.connection.tls import (
    asyncio_cluster_takes_key_password,
    asyncio_takes_key_password,
)
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.idempotency import Fingerprint, IdempotencyStore, StoredResponse
from django_redispatterns.locks import Lock, held_key
from django_redispatterns.ratelimit import RateLimiter
from tests.redis_servers import KEY_PREFIX
from tests.test_cache_support import make_cache
from tests.tls_servers import (
    Certificates,
    TLSRedisServer,
    TLSSentinel,
    tls_cluster,
    tls_url,
)
from tests.topologies import wait_for

WRONG_CA = ("certificate verify failed: self-signed certificate in certificate chain")
WRONG_NAME = "certificate verify failed: IP address mismatch, certificate is not valid for " \
             "'127.0.0.1'"


@pytest.fixture(scope="module")
def certs(tls_certs: Certificates) -> Certificates:
    return tls_certs


@pytest.fixture(scope="module")
def tls_server(certs: Certificates) -> Iterator[TLSRedisServer]:
    server = TLSRedisServer(certs, auth_clients="yes")
    yield server
    server.stop()


def patterns(url: str, tls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # Generous timeouts: TLS handshakes on a loaded machine.
    return {"CONNECTION": url, "KEY_PREFIX": KEY_PREFIX, "TLS": tls, "SOCKET_TIMEOUT": 5,
            "SOCKET_CONNECT_TIMEOUT": 5, **extra}


@pytest.fixture
def over_tls(tls_server: TLSRedisServer, certs: Certificates) -> Iterator[TLSRedisServer]:
    """Every feature's connection is the TLS server; the client key is encrypted."""
    with override_settings(REDIS_PATTERNS=patterns(tls_server.url,
                                                   certs.settings(encrypted=True))):
        yield tls_server


# --- settings -------------------------------------------------------------------------


@pytest.fixture
def no_run_tls_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package's own TLS defaults, not those a rediss:// test run installs from its
    REDIS_TLS_* variables (tests/settings.py), for tests of the defaults themselves."""
    from django_redispatterns.conf import SCHEMA
    from tests.settings import TLS

    for key in TLS:
        monkeypatch.setitem(SCHEMA["TLS"], key, (SCHEMA["TLS"][key][0], None))


@pytest.mark.usefixtures("no_run_tls_defaults")
def test_tls_settings_are_validated_naming_the_key(certs: Certificates, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigurationError, match=r"REDIS_PATTERNS\['TLS'\]\['CA_CERTS'\] "
                                                 r"must name a readable file; '.*nope.pem' "
                                                 r"is not a file\."):
        build_config({"TLS": {"CA_CERTS": missing}})
    with pytest.raises(ConfigurationError, match=r"\['KEYFILE'\] needs REDIS_PATTERNS"):
        build_config({"TLS": {"KEYFILE": certs.path("client.key")}})
    with pytest.raises(ConfigurationError, match=r"\['TLS'\]\['CHECK_HOSTNAME'\] must be bool"):
        build_config({"TLS": {"CHECK_HOSTNAME": "no"}})
    assert build_config({}).tls["CHECK_HOSTNAME"] is True  # verification on by default


# --- every feature over TLS -----------------------------------------------------------


def test_the_client_uses_tls_and_presents_the_client_certificate(
        over_tls: TLSRedisServer) -> None:
    client = connection.get_client()
    assert client.ping()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_check_hostname"] is True
    # The server requires a client certificate: without one it hangs up.
    without = patterns(over_tls.url, {"CA_CERTS": over_tls.certs.ca})
    with override_settings(REDIS_PATTERNS=without), pytest.raises(redis.ConnectionError):
        connection.get_client().ping()


def test_locks_rate_limits_idempotency_and_sessions_over_tls(over_tls: TLSRedisServer) -> None:
    raw = over_tls.client()
    limiter = RateLimiter("3/m", group="tls")
    assert [limiter.hit("who").remaining for _ in range(4)] == [2, 1, 0, 0]

    store = IdempotencyStore(over_tls.url)
    fingerprint = Fingerprint.of("POST", "/pay/", "", "application/json", b"{}")
    claim = store.begin("user:1", "tls-key", fingerprint, lease=5)
    response = StoredResponse(201, (), b"ok")
    assert store.complete(claim, response, fingerprint, ttl=60)  # type: ignore[arg-type]
    assert store.begin("user:1", "tls-key", fingerprint, lease=5) == response

    from django_redispatterns.sessions import SessionStore

    session = SessionStore()
    session["n"] = 1
    session.save()
    assert SessionStore(session.session_key)["n"] == 1
    session.delete()

    holder = Lock("tls-handover", ttl=30)
    assert holder.acquire()
    assert raw.exists(held_key("tls-handover"))
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    waiter = Lock("tls-handover", ttl=5, wait=10)  # a blocking wait on its own connection
    try:
        assert waiter.acquire()
    finally:
        timer.join()
        waiter.release()


def test_asyncio_clients_and_async_locks_over_tls(over_tls: TLSRedisServer) -> None:
    async def run() -> None:
        assert await connection.get_async_client().ping()
        async with Lock("tls-async", ttl=5):
            assert over_tls.client().exists(held_key("tls-async"))

    if get_config().tls["KEY_PASSWORD"] and not asyncio_takes_key_password():
        # an older redis-py: refused by name, never a passphrase silently dropped
        with pytest.raises(ConfigurationError, match="asyncio client cannot decrypt a "
                                                     "client key"):
            asyncio.run(run())
        return
    asyncio.run(run())


def test_redlock_over_three_tls_masters(certs: Certificates, over_tls: TLSRedisServer) -> None:
    others = [TLSRedisServer(certs) for _ in range(2)]
    try:
        urls = [over_tls.url, *(s.url for s in others)]
        with Lock("tls-quorum", ttl=5, quorum=urls):
            assert all(s.client().exists(held_key("tls-quorum")) for s in [over_tls, *others])
    finally:
        for server in others:
            server.stop()


def test_cache_with_near_cache_sync_and_async_over_tls(over_tls: TLSRedisServer) -> None:
    cache = make_cache(over_tls.url, NEAR_CACHE={})
    try:
        assert cache._near._start().wait_ready(10)  # tracking + invalidation channel
        cache.set("tls-k", "v", 30)
        assert cache.get("tls-k") == "v"
        assert cache.get("tls-k") == "v"  # served locally now

        async def run() -> Any:
            await cache.aset("tls-a", "w", 30)
            return await cache.aget("tls-a")

        assert asyncio.run(run()) == "w"
    finally:
        cache._near.stop()


def test_operator_commands_over_tls(over_tls: TLSRedisServer) -> None:
    out = io.StringIO()
    call_command("redis_audit", "--connection", over_tls.url, "--json", stdout=out,
                 stderr=io.StringIO())
    assert isinstance(json.loads(out.getvalue()), dict)
    with Lock("tls-listed", ttl=5):
        out = io.StringIO()
        call_command("locks", "list", stdout=out)
        assert "tls-listed" in out.getvalue()


# --- refused certificates ---------------------------------------------------------------


def test_a_server_signed_by_another_ca_is_refused(tls_server: TLSRedisServer,
                                                  certs: Certificates) -> None:
    tls = certs.settings(CA_CERTS=certs.path("other-ca.crt"))
    with override_settings(REDIS_PATTERNS=patterns(tls_server.url, tls)):
        with pytest.raises(redis.ConnectionError, match=WRONG_CA):
            connection.get_client().ping()
        # django-redis's pools get the settings too (its pools are kept per URL: a new one)
        cache = make_cache(tls_server.url.replace("/0", "/1"))
        with pytest.raises(redis.ConnectionError, match=WRONG_CA):
            cache.client.get_client(write=True).ping()


def test_a_server_certificate_for_another_name_is_refused(certs: Certificates) -> None:
    misnamed = TLSRedisServer(certs, server_cert="misnamed")
    try:
        with (override_settings(REDIS_PATTERNS=patterns(misnamed.url, certs.settings())),
              pytest.raises(redis.ConnectionError, match=WRONG_NAME)):
            connection.get_client().ping()
        # Only with the name check turned off (which a deploy check warns about).
        tls = certs.settings(CHECK_HOSTNAME=False)
        with override_settings(REDIS_PATTERNS=patterns(misnamed.url, tls)):
            assert connection.get_client().ping()
    finally:
        misnamed.stop()


# --- deploy checks ----------------------------------------------------------------------


def deploy(url: str, tls: dict[str, Any]) -> list[Any]:
    caches = {"default": {"BACKEND": "django_redispatterns.cache.RedisCache",
                          "LOCATION": url, "TIMEOUT": 300}}
    with override_settings(CACHES=caches, REDIS_PATTERNS=patterns(url, tls),
                           SESSION_ENGINE="django.contrib.sessions.backends.db"):
        return deploy_messages()


def deploy_messages() -> list[Any]:
    """The deploy check's connection and TLS messages for the current settings."""
    return [m for m in checks.check_redis_servers()
            if m.id in ("redispatterns.W010", "redispatterns.W030", "redispatterns.W031")]


def test_deploy_check_reports_a_refused_certificate_and_a_disabled_name_check(
        tls_server: TLSRedisServer, certs: Certificates) -> None:
    assert deploy(tls_server.url, certs.settings()) == []
    refused = deploy(tls_server.url, certs.settings(CA_CERTS=certs.path("other-ca.crt")))
    assert [m.id for m in refused] == ["redispatterns.W030"]
    assert refused[0].msg.startswith(
        f"Redis at rediss://127.0.0.1:{tls_server.port} (cache 'default', idempotency "
        "records, locks, rate limits) presented a certificate that was refused: "
        f"ConnectionError: Error 1 connecting to 127.0.0.1:{tls_server.port}. "
        f"[SSL: CERTIFICATE_VERIFY_FAILED] {WRONG_CA}")
    unchecked = deploy(tls_server.url, certs.settings(CHECK_HOSTNAME=False))
    assert [(m.id, m.msg) for m in unchecked] == [(
        "redispatterns.W031", "TLS connections do not check the server's host name "
        "(REDIS_PATTERNS['TLS']['CHECK_HOSTNAME'] is False).")]


# --- Sentinel and Cluster over TLS ------------------------------------------------------


# The deploy check covers every Redis cache too: the suite's own (over a managed TLS run,
# a server of another CA than these tests' topologies) is no part of these checks.
NO_REDIS_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def test_sentinel_over_tls(certs: Certificates, tls_server: TLSRedisServer) -> None:
    sentinel = TLSSentinel(certs, tls_server.port, "tlsmaster")
    try:
        url = f"rediss+sentinel://127.0.0.1:{sentinel.port}/tlsmaster/0"
        with override_settings(REDIS_PATTERNS=patterns(url, certs.settings()),
                               CACHES=NO_REDIS_CACHE):
            wait_for(lambda: _pings(connection.get_client()), 20, "the master over TLS")
            with Lock("tls-sentinel", ttl=5):
                assert tls_server.client().exists(held_key("tls-sentinel"))
            assert [m.id for m in deploy_messages()] == []

            assert asyncio.run(_async_ping())
    finally:
        sentinel.stop()


async def _async_ping() -> Any:
    return await connection.get_async_client().ping()


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.usefixtures("no_run_tls_defaults")  # (its unencrypted settings have no password)
def test_cluster_over_tls(certs: Certificates) -> None:
    cluster = tls_cluster(certs)
    try:
        url = tls_url(cluster.url)
        with override_settings(REDIS_PATTERNS=patterns(url, certs.settings(encrypted=True)),
                               CACHES=NO_REDIS_CACHE):
            client = connection.get_client()
            assert client.set(f"{KEY_PREFIX}:tls-c", "1", ex=30)
            limiter = RateLimiter("2/m", group="tls-cluster")
            assert [limiter.hit("who").remaining for _ in range(3)] == [1, 0, 0]
            with Lock("tls-cluster", ttl=5):
                pass
            assert [m.id for m in deploy_messages()] == []
            if not asyncio_cluster_takes_key_password():
                with pytest.raises(ConfigurationError, match="asyncio Cluster client cannot "
                                                             "decrypt a client key"):
                    asyncio.run(_async_ping())
        with override_settings(REDIS_PATTERNS=patterns(url, certs.settings())):
            assert asyncio.run(_async_ping())
        wrong = certs.settings(CA_CERTS=certs.path("other-ca.crt"))
        with (override_settings(REDIS_PATTERNS=patterns(url, wrong)),
              pytest.raises(redis.exceptions.RedisClusterException, match=WRONG_CA)):
            connection.get_client().ping()
    finally:
        cluster.stop()
