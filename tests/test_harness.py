"""The test harness itself: safe on a Redis that other workers, runs and programs share.

With ``REDIS_URL`` set, two xdist workers (and maybe another run, and other software) use
one server. Each worker has its own key prefix, checks and cleans only its own keys, and
never sends a server-wide command (FLUSHALL, CONFIG SET, ...) to a server it did not start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.conftest import refuse_server_wide_commands_on_servers_we_did_not_start
from tests.redis_servers import (
    CACHE_PREFIX,
    KEY_PREFIX,
    RedisServer,
    delete_own_keys,
    own_keys_without_ttl,
    reap_orphans,
)

ROOT = Path(__file__).resolve().parent.parent

# Keys that are not this worker's: another worker's or run's, the prefix every worker used
# to share, and another program's (with and without a TTL).
FOREIGN = {
    "rptest-zzzzzz-gw0:lock:{locks}:report": None,
    "rptest-zzzzzz-gw0-cache:1:page": 600,
    "rptest:sess:{u}:u": None,
    ":1:rptest:legacy": None,
    "myapp:session:42": None,
    "myapp:cache:home": 600,
    f"{KEY_PREFIX}0:lock:x": None,  # a worker whose id extends ours (gw1 / gw10)
}
OWN = [f"{KEY_PREFIX}:lock:{{locks}}:report", f"{KEY_PREFIX}:rl:x", f"{CACHE_PREFIX}:1:page",
       f"{KEY_PREFIX}-drs:abc"]


@pytest.fixture
def populated(redis_server_factory: Callable[..., RedisServer]) -> redis.Redis:
    client = redis_server_factory().client()
    for key, ttl in FOREIGN.items():
        client.set(key, "theirs", ex=ttl)
    for key in OWN:
        client.set(key, "ours")
    return client


def test_clean_up_deletes_this_workers_keys_and_nobody_elses(populated: redis.Redis) -> None:
    delete_own_keys(populated)
    assert [populated.exists(key) for key in OWN] == [0] * len(OWN)
    for key, ttl in FOREIGN.items():
        assert populated.get(key) == b"theirs", key
        assert (populated.ttl(key) > 0) if ttl else (populated.ttl(key) == -1), key


def test_ttl_check_looks_at_this_workers_app_keys_only(populated: redis.Redis) -> None:
    # Another worker's audit fixtures and another program's keys may lack a TTL on purpose.
    assert sorted(own_keys_without_ttl(populated)) == sorted(
        k.encode() for k in OWN if k.startswith(f"{KEY_PREFIX}:"))


def prefix_in(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-c", "from tests.redis_servers import KEY_PREFIX; print(KEY_PREFIX)"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_each_worker_and_each_run_has_its_own_prefix_children_share_it() -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER",)}
    gw0 = prefix_in({**base, "PYTEST_XDIST_WORKER": "gw0"})
    gw1 = prefix_in({**base, "PYTEST_XDIST_WORKER": "gw1"})
    assert gw0 != gw1 and gw0.startswith("rptest-") and gw1.startswith("rptest-")
    # a spawned child or a subprocess of a worker writes under that worker's prefix
    assert prefix_in({**base, "PYTEST_XDIST_WORKER": "gw0"}) == gw0
    other_run = {k: v for k, v in base.items() if k != "RPTEST_RUN"}
    assert prefix_in({**other_run, "PYTEST_XDIST_WORKER": "gw0"}) != gw0


@pytest.mark.parametrize("command", [
    ("FLUSHALL",), ("FLUSHDB",), ("flushdb", "ASYNC"), ("CONFIG", "SET", "maxmemory", "1"),
    ("SCRIPT", "FLUSH"), ("CLIENT", "PAUSE", 1000), ("SLOWLOG", "RESET"), ("DEBUG", "SLEEP", 1),
])
def test_server_wide_commands_are_refused_on_a_server_this_run_did_not_start(
        command: tuple[object, ...]) -> None:
    # Port 1: nothing listens there, so even without the guard nothing could be flushed.
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(AssertionError, match="did not start"):
        client.execute_command(*command)
    with pytest.raises(AssertionError, match="did not start"):
        refuse_server_wide_commands_on_servers_we_did_not_start(client, command)


def test_redis_py_helpers_are_refused_too() -> None:
    client = redis.Redis(host="localhost", port=1, socket_connect_timeout=0.5)
    for call in (client.flushall, client.flushdb, client.script_flush, client.config_resetstat):
        with pytest.raises(AssertionError, match="did not start"):
            call()


def test_server_wide_commands_run_on_a_server_this_run_started(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    client = redis_server_factory().client()
    client.set("x", "1", ex=60)
    assert client.flushall() and client.dbsize() == 0
    assert client.config_set("maxmemory", "64mb")
    client.get("x")  # reads and writes of keys are never refused, anywhere
    assert client.set(b"bytes:\xff\x1b", 1, ex=60)  # any key name, not only UTF-8


def test_own_redis_points_the_app_at_a_server_of_the_tests_own(own_redis: redis.Redis) -> None:
    from django.core.cache import caches

    from django_redispatterns import connection

    caches["patterns"].set("probe", "1", 30)
    assert own_redis.get(f"{CACHE_PREFIX}:1:probe") is not None
    connection.get_client().set(f"{KEY_PREFIX}:probe", "1", px=30_000)
    assert own_redis.get(f"{KEY_PREFIX}:probe") == b"1"
    assert own_redis.config_resetstat()  # its own: server-wide commands are fine


def test_no_test_hard_codes_the_key_prefix() -> None:
    """Keys named ``rptest...`` by hand escape the per-worker clean-up and TTL check (and
    collide between workers on a shared REDIS_URL): tests use KEY_PREFIX / CACHE_PREFIX."""
    allowed = {"redis_servers.py", "test_harness.py"}
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"""(?<!\w)[fbrFBR]{0,2}["']rptest""", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "use tests.redis_servers.KEY_PREFIX / CACHE_PREFIX:\n" + "\n".join(found)


def test_servers_of_a_killed_run_are_reaped() -> None:
    """A run killed before its atexit leaves its servers running; the next run stops them
    (and never a server whose owner still runs)."""
    script = ("import os, sys; from tests.redis_servers import RedisServer; s = RedisServer(); "
              "print(s.dir, s.process.pid, flush=True); os._exit(0)")  # skips atexit
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    directory, pid = out[0], int(out[1])
    mine = RedisServer()
    try:
        os.kill(pid, 0)  # the orphan is alive
        assert reap_orphans() >= 1
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
        assert not os.path.exists(directory)
        assert mine.client().ping()  # ours, whose owner runs, was left alone
    finally:
        mine.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by init) counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
