"""``manage.py redis_audit`` on real, throwaway servers (the keys it needs lack TTLs on purpose)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_redispatterns.management.commands import redis_audit
from django_redispatterns.management.commands.redis_audit import key_pattern
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.allow_no_ttl

WITH_TTL = 90_000
WITHOUT_TTL = 10_000
Factory = Callable[..., RedisServer]


_FILL = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  if ARGV[3] == 'ttl' then
    redis.call('SET', string.format('app:session:%08x%08x', i, i), 's', 'EX', 3600)
  else
    redis.call('SET', 'legacy:user:' .. i, 'u')
  end
end
"""


def populate(client: redis.Redis, with_ttl: int = 1000, without_ttl: int = 100) -> int:
    """Keys of a typical app: sessions and cache entries with TTLs, a legacy family without.

    Written server-side in chunks (test set-up only), which is many times faster than
    sending 100,000 SETs from Python.
    """
    try:
        for count, kind in ((with_ttl, "ttl"), (without_ttl, "eternal")):
            for start in range(0, count, 10_000):
                client.eval(_FILL, 0, start, min(start + 10_000, count) - 1, kind)
    except redis.ResponseError:  # scripting disabled on this server: the slow way
        pipe = client.pipeline(transaction=False)
        for i in range(with_ttl):
            pipe.set(f"app:session:{i:08x}{i:08x}", "s", ex=3600)
        for i in range(without_ttl):
            pipe.set(f"legacy:user:{i}", "u")
        pipe.execute()
    client.hset("legacy:big", mapping={f"field{i}": "x" * 100 for i in range(2000)})
    return with_ttl + without_ttl + 1


def audit(url: str, *args: str) -> dict[str, Any]:
    out = _run(url, "--json", *args)
    report: dict[str, Any] = json.loads(out)
    return report


def _run(url: str, *args: str, stderr: Any = None) -> str:
    import io

    stdout = io.StringIO()
    call_command("redis_audit", "--connection", url, *args, stdout=stdout,
                 stderr=stderr or io.StringIO())
    return stdout.getvalue()


@pytest.fixture(scope="module")
def big_server() -> Iterator[RedisServer]:
    """100,001 keys: 90,000 with a TTL, 10,001 without."""
    try:
        server = RedisServer()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    populate(server.client(), WITH_TTL, WITHOUT_TTL)
    yield server
    server.stop()


@pytest.fixture
def small_server(redis_server_factory: Factory) -> RedisServer:
    server = redis_server_factory()
    populate(server.client())
    return server


# --- the big keyspace -------------------------------------------------------------------


def test_audit_of_100k_keys_reports_exactly_and_never_blocks_others(
        big_server: RedisServer) -> None:
    client = big_server.client()
    client.config_resetstat()
    client.config_set("slowlog-log-slower-than", "20000")  # microseconds
    client.slowlog_reset()
    latencies: list[float] = []
    stop = threading.Event()

    def other_client() -> None:
        other = big_server.client()
        while not stop.is_set():
            started = time.perf_counter()
            other.get("app:session:probe")
            latencies.append(time.perf_counter() - started)

    probe = threading.Thread(target=other_client)
    probe.start()
    try:
        report = audit(big_server.url)
    finally:
        stop.set()
        probe.join()

    assert report["scanned"] == WITH_TTL + WITHOUT_TTL + 1
    assert report["measured"] == report["scanned"]
    assert report["no_ttl"]["count"] == WITHOUT_TTL + 1
    groups = {g["pattern"]: g["count"] for g in report["no_ttl"]["groups"]}
    assert groups == {"legacy:user:*": WITHOUT_TTL, "legacy:big": 1}
    assert report["largest"][0]["key"] == "legacy:big"
    assert report["largest"][0]["type"] == "hash"
    assert report["largest"][0]["ttl_ms"] == -1
    assert len(report["largest"]) == 10

    # Another client kept being served throughout. Its round trip includes OS scheduling
    # (2 shared cores, often loaded), hence the generous bound; a KEYS-like stall of the
    # server is bounded separately below.
    assert len(latencies) > 10
    assert max(latencies) < 5.0, f"other client waited {max(latencies):.3f}s"
    # ... and Redis itself never ran one command long enough to matter (robust to OS
    # scheduling on a busy machine, unlike the client-side number).
    slow = client.slowlog_get(1000)
    assert max((e["duration"] for e in slow), default=0) < 1_000_000, slow[:3]
    # SCAN in batches, never KEYS, nothing written.
    stats = client.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert stats["cmdstat_scan"]["calls"] >= report["scanned"] // 1000
    written = {"cmdstat_set", "cmdstat_del", "cmdstat_unlink", "cmdstat_expire",
               "cmdstat_pexpire", "cmdstat_persist"}
    assert not written & set(stats)
    assert client.dbsize() == report["scanned"]


def test_fail_on_no_ttl_exits_with_status_1(big_server: RedisServer) -> None:
    with pytest.raises(CommandError, match=r"^10001 key\(s\) without a TTL") as info:
        _run(big_server.url, "--fail-on-no-ttl", "--sample", "0")
    assert info.value.returncode == 1
    # Only keys with TTLs under this prefix: success.
    _run(big_server.url, "--fail-on-no-ttl", "--prefix", "app:session:", "--sample", "0")


def test_progress_goes_to_stderr(big_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(redis_audit.Command, "progress_interval", 0.0)
    stderr = io.StringIO()
    out = _run(big_server.url, "--sample", "0", stderr=stderr)
    lines = stderr.getvalue().splitlines()
    assert len(lines) >= 10
    assert "scanned" in lines[0] and "of ~100,001" in lines[0]
    assert "keys..." not in out  # stdout stays the report


# --- options ----------------------------------------------------------------------------


def test_prefix_limits_the_scan_and_is_not_a_glob(small_server: RedisServer) -> None:
    client = small_server.client()
    client.set("odd*key:1", "x")
    client.set("oddXkey:1", "x")
    report = audit(small_server.url, "--prefix", "odd*")
    assert report["scanned"] == 1
    assert report["no_ttl"]["groups"][0]["example"] == "odd*key:1"
    report = audit(small_server.url, "--prefix", "legacy:user:")
    assert (report["scanned"], report["no_ttl"]["count"]) == (100, 100)


def test_sampling_measures_one_key_in_n(small_server: RedisServer) -> None:
    report = audit(small_server.url, "--sample", "10")
    assert report["measured"] == math.ceil(report["scanned"] / 10)
    report = audit(small_server.url, "--sample", "0", "--top", "3")
    assert (report["measured"], report["largest"]) == (0, [])
    assert report["no_ttl"]["count"] == 101  # TTLs are always checked


def test_small_batches_see_every_key_once(small_server: RedisServer) -> None:
    report = audit(small_server.url, "--count", "7", "--top", "1")
    assert report["scanned"] == small_server.client().dbsize()
    assert [k["key"] for k in report["largest"]] == ["legacy:big"]


def test_text_report(small_server: RedisServer) -> None:
    out = _run(small_server.url)
    assert "Keys without a TTL: 101" in out
    assert "legacy:user:*" in out
    assert "Largest keys" in out and "legacy:big" in out
    assert "maxmemory 0 (no limit), maxmemory-policy noeviction (read with CONFIG)" in out


@pytest.mark.parametrize("prefix", ["rpaudit", "app2", "run-1f2e3d-gw0"])
def test_our_own_ttl_less_keys_are_flagged(small_server: RedisServer, prefix: str) -> None:
    # Prefixes with digits too: the app's prefix is kept literally in the patterns.
    client = small_server.client()
    client.set(f"{prefix}:lock:stray", "x")
    client.set("app3:lock:stray", "x")  # another app's key, folded like any other
    try:
        with override_settings(REDIS_PATTERNS={"KEY_PREFIX": prefix}):
            report = audit(small_server.url)
            text = _run(small_server.url)
    finally:
        client.delete(f"{prefix}:lock:stray", "app3:lock:stray")
    ours = [g for g in report["no_ttl"]["groups"] if g["ours"]]
    assert [g["pattern"] for g in ours] == [f"{prefix}:lock:stray"]
    assert "written by django-redispatterns" in text


def test_bad_options_and_connections_are_command_errors(small_server: RedisServer) -> None:
    with pytest.raises(CommandError, match="--count"):
        _run(small_server.url, "--count", "0")
    with pytest.raises(CommandError, match="cannot use connection 'nope'"):
        _run("nope")
    dead = small_server.url
    small_server.kill()
    with pytest.raises(CommandError, match=r"Redis at redis://127\.0\.0\.1:\d+/0 failed: "
                       "ConnectionError") as info:
        _run(dead)
    assert info.value.returncode == 1


# --- restricted servers -----------------------------------------------------------------


def test_memory_command_disabled_still_audits_ttls(redis_server_factory: Factory) -> None:
    server = redis_server_factory("--rename-command", "MEMORY", "")
    populate(server.client())
    report = audit(server.url)
    assert report["no_ttl"]["count"] == 101
    assert report["memory_usage_available"] is False
    assert report["largest"] == []


def test_scripting_disabled_falls_back_to_a_pipeline(redis_server_factory: Factory) -> None:
    server = redis_server_factory("--rename-command", "EVALSHA", "",
                                  "--rename-command", "EVAL", "")
    total = populate(server.client())
    report = audit(server.url)
    assert (report["scanned"], report["measured"]) == (total, total)
    assert report["no_ttl"]["count"] == 101
    assert report["largest"][0]["key"] == "legacy:big"


def test_config_disabled_reads_eviction_settings_from_info(redis_server_factory: Factory) -> None:
    server = redis_server_factory("--maxmemory", "32mb", "--maxmemory-policy", "allkeys-lru",
                                  "--rename-command", "CONFIG", "")
    (facts,) = audit(server.url)["servers"]
    assert (facts["source"], facts["policy"], facts["maxmemory"]) == (
        "INFO", "allkeys-lru", 32 << 20)


# --- Cluster ----------------------------------------------------------------------------


def test_cluster_audit_scans_every_master(cluster_url: str, redis_cluster: Any) -> None:
    client = redis_cluster.client()
    for i in range(300):
        client.set(f"audit:ttl:{i}", "x", ex=600)
    for i in range(30):
        client.set(f"audit:eternal:{i}", "x")
    try:
        report = audit(cluster_url, "--prefix", "audit:")
        assert len(report["servers"]) == 3
        assert all(s["scanned"] > 0 for s in report["servers"])  # keys spread over masters
        assert report["scanned"] == 330
        assert report["no_ttl"]["count"] == 30
        assert {g["pattern"] for g in report["no_ttl"]["groups"]} == {"audit:eternal:*"}
    finally:
        for i in range(300):
            client.delete(f"audit:ttl:{i}")
        for i in range(30):
            client.delete(f"audit:eternal:{i}")


# --- grouping ---------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "pattern"), [
    ("user:42:profile", "user:*:profile"),
    ("session:3f2a9c0d4b5e6f70", "session:*"),
    ("session:0123456789abcdef0123456789abcdef", "session:*"),
    ("rp:rl:{ab12cd}:x", "rp:rl:{*}:x"),
    ("job17", "job*"),
    (":1:views.decorators.cache.cache_page.abc", ":*:views.decorators.cache.cache_page.abc"),
    ("celery-task-meta-6f1c0f5e-1f0b-4a7e-9a6c-0e1d2c3b4a59", "*"),
    ("config", "config"),
])
def test_key_patterns_fold_ids(key: str, pattern: str) -> None:
    assert key_pattern(key) == pattern
