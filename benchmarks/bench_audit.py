"""redis_audit: throughput, and what other clients feel while it runs.

Both scenarios run on a **throwaway redis-server** started for the run, because the
comparison includes ``KEYS``, which blocks the server, and we never do that to a shared one.

1. Throughput on 100,001 keys (90 % with a TTL): ``manage.py redis_audit`` (SCAN plus one
   script per batch) against what people write by hand: ``KEYS *`` followed by pipelined
   ``PTTL`` / ``MEMORY USAGE``, and ``scan_iter`` with one ``TTL`` + ``MEMORY USAGE`` round
   trip per key. Every contender does the same per-key work.
2. Other-client latency on 1,000,000 keys: while each approach runs once, a separate
   process sends ``GET`` in a loop and records its worst and 99th-percentile latency.
"""

from __future__ import annotations

import multiprocessing
import time
from io import StringIO
from typing import Any

import redis
from django.core.management import call_command

from benchmarks.harness import compare
from tests.redis_servers import RedisServer

SMALL = 100_000
LARGE = 1_000_000
_FILL = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  if i % 10 == 0 then
    redis.call('SET', 'legacy:user:' .. i, 'u')
  else
    redis.call('SET', string.format('app:session:%08x', i), 's', 'EX', 3600)
  end
end
"""


def fill(client: redis.Redis, count: int) -> None:
    """``count`` keys, one in ten without a TTL, written server-side in chunks."""
    for start in range(0, count, 20_000):
        client.eval(_FILL, 0, start, min(start + 20_000, count) - 1)
    client.hset("legacy:big", mapping={f"f{i}": "x" * 100 for i in range(2000)})


def ours(url: str) -> None:
    call_command("redis_audit", "--connection", url, "--json", stdout=StringIO(),
                 stderr=StringIO())


def _summarise(client: redis.Redis, keys: list[Any], answers: list[Any], top: list[Any],
               no_ttl: list[int]) -> None:
    for i, key in enumerate(keys):
        ttl, size = answers[2 * i], answers[2 * i + 1]
        if ttl == -1:
            no_ttl[0] += 1
        if isinstance(size, int):
            top.append((size, key))
    top.sort(reverse=True)
    del top[10:]


def naive_keys(client: redis.Redis) -> None:
    """KEYS *, then the same per-key work as ours, pipelined in chunks of 1000."""
    keys = client.keys("*")
    top: list[Any] = []
    no_ttl = [0]
    for start in range(0, len(keys), 1000):
        chunk = keys[start:start + 1000]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
            pipe.memory_usage(key)
        _summarise(client, chunk, pipe.execute(), top, no_ttl)


def naive_scan_per_key(client: redis.Redis) -> None:
    """scan_iter, then one round trip per key for TTL and one for MEMORY USAGE."""
    top: list[Any] = []
    no_ttl = [0]
    for key in client.scan_iter(count=1000):
        answers = [client.pttl(key), client.memory_usage(key)]
        _summarise(client, [key], answers, top, no_ttl)


def _probe_latency(port: int, stop: Any, out: Any) -> None:
    client = redis.Redis(port=port, socket_timeout=30)
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        client.get("probe")
        latencies.append(time.perf_counter() - started)
    out.send(latencies)


def other_client_latency(port: int, run: Any) -> tuple[float, float, float, int, float]:
    """Run ``run()`` once while another process sends GETs.

    Returns (seconds, max GET latency, p99 GET latency, GETs, longest server-side command).
    The client-side numbers include OS scheduling on a busy machine; the last one (from
    SLOWLOG) is how long Redis itself was unavailable to everyone else at worst.
    """
    admin = redis.Redis(port=port, socket_timeout=30)
    admin.config_set("slowlog-log-slower-than", "1000")  # microseconds
    admin.config_set("slowlog-max-len", "100000")
    admin.slowlog_reset()
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    receiver, sender = ctx.Pipe(duplex=False)
    prober = ctx.Process(target=_probe_latency, args=(port, stop, sender))
    prober.start()
    time.sleep(1.0)  # the prober is connected and looping
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    stop.set()
    latencies = sorted(receiver.recv())
    prober.join()
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("nan")
    longest = max((entry["duration"] for entry in admin.slowlog_get(100000)), default=0) / 1e6
    return elapsed, max(latencies), p99, len(latencies), longest


def run() -> None:
    server = RedisServer()
    try:
        client = server.client(socket_timeout=120)
        fill(client, SMALL)
        total = client.dbsize()
        results = compare(
            f"audit of {total:,} keys (1 op = one whole audit; throwaway server)",
            {
                "django-redispatterns redis_audit (SCAN + 1 script/batch)": lambda: ours(
                    server.url),
                "naive: KEYS * + pipelined PTTL/MEMORY USAGE": lambda: naive_keys(client),
                "naive: scan_iter + 2 round trips per key": lambda: naive_scan_per_key(client),
            },
            ops=1, rounds=3, warmup=0,
        )
        print(f"{'contender':<60} {'median keys/s':>14}")
        for result in results:
            print(f"{result.contender:<60} {result.median * total:>14,.0f}")

        client.flushall()
        fill(client, LARGE)
        total = client.dbsize()
        print(f"\n## other-client GET latency while auditing {total:,} keys "
              "(one run each; throwaway server)")
        print(f"{'approach':<52} {'run s':>7} {'max ms':>8} {'p99 ms':>8} {'GETs':>8} "
              f"{'longest server cmd ms':>22}")
        for name, job in (
            ("django-redispatterns redis_audit (SCAN)", lambda: ours(server.url)),
            ("naive: KEYS * + pipelined PTTL/MEMORY USAGE", lambda: naive_keys(client)),
        ):
            elapsed, worst, p99, count, longest = other_client_latency(server.port, job)
            print(f"{name:<52} {elapsed:>7.1f} {worst * 1000:>8.1f} {p99 * 1000:>8.2f} "
                  f"{count:>8,} {longest * 1000:>22.1f}")
        print("(max/p99: another process's GET round trip, including OS scheduling on this "
              "machine; longest server cmd: SLOWLOG, the time Redis served no one else)")
    finally:
        server.stop()

