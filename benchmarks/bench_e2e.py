"""End to end: the soak app on gunicorn, ours against the stack users replace.

Two gunicorns (4 workers x 4 threads each) serve the same app (``soak/app``), each with its
own redis-server: **ours** (our cache backend, session engine with
SessionActivityMiddleware, ``@ratelimit`` / ``RateLimitMiddleware``,
``IdempotencyMiddleware``) and **theirs** (django-redis's cache, Django's cache session
engine, django-ratelimit's fixed window, no idempotency layer). One closed-loop load (16
signed-in devices, spread evenly over each server's workers; :mod:`benchmarks.e2e_load`)
alternates between them **every second**, all devices together, so both stacks share every
moment of the (shared, noisy) machine; each second is a round. Scenarios: the mix, the same
mix without the idempotent ``POST /orders`` (``mix_same``: the routes both stacks serve
alike; the POST is where ours does more on purpose), then each route alone. Rate limits are
set so high that every request is admitted: this measures the admitted path, not 429s. We
report per route the median over the rounds of requests/s and the median latency, and their
ratios ours/theirs (> 1: ours is faster), the redis-server CPU per request, the app's CPU per
request (the gunicorn's every process and thread, idle rounds included: with the app pinned
its core is saturated, so this is the cost that sets the rate),
and the Redis commands each request sent (from ``MONITOR``; commands run inside a script not
counted).
Then py-spy samples the workers of each stack under the mix, charged to the layer that
spent them (:mod:`benchmarks.e2e_profile`).

Two configurations, one after the other, each with fresh servers: **shared** (every process
may run on every core) and **pinned** (both gunicorns on one core of their own, the
redis-servers and the load on the other, as ``taskset`` would place them: in production
neither Redis nor the clients run on the app's CPU). ``E2E_PINNED`` picks them: ``both``
(default), ``0`` (shared only), ``1`` (pinned only). redis-py (both stacks) parses replies
with hiredis when it is installed (``pip install django-redispatterns[fast]``); the header
says which parser ran.

Ours runs with the opt-in process memories ``E2E_MEMORY`` names: ``sessions,cache``
(default: signed-in session loads and the cached route's values served from memory, kept
correct by Redis tracking), ``sessions``, ``cache``, or ``none`` (every feature at its
defaults). The header says which.

``E2E_SCENARIOS`` (comma-separated: ``mix``, ``mix_same`` and route names) runs only those.
``E2E_SECONDS`` (48) is the length of each route's scenario (the mix runs four times as
long: its ratio is the one nearest the line, and the median of a round's requests/s moves
with the machine, so it needs the most rounds; ``mix_same`` twice),
``E2E_PROFILE_SECONDS`` (20, 0 = no profile) the profile's (under the first configuration).

``E2E_SAME=ours`` (or ``theirs``) is the calibration: both servers run that one stack, so
every ratio is the benchmark's own noise (how far apart two copies of one app measure).
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import e2e_load, e2e_profile

ROUTES = {
    "me": "GET /me (signed in)",
    "rl_fixed": "GET /rl/fixed (fixed window)",
    "rl_sliding": "GET /rl/sliding (ours: sliding window)",
    "rl_gcra": "GET /rl/gcra (ours: token bucket)",
    "api_rule": "GET /api/echo (ours: middleware rule)",
    "cached": "GET /cached (get_or_set, hits)",
    "order": "POST /orders (ours: Idempotency-Key)",
}
STACKS = ("ours", "theirs")
SLOT = 1.0  # seconds per round
# The mix runs this many times longer than a route alone: every route's noise feeds it, its
# per-route figures are a fraction of its rounds, and its ratio is the one nearest 1.0. Two
# copies of one stack measured 0.99-1.05 apart over 60 s of the mix, and 60 s windows of
# one long run 0.97-1.03 apart: more rounds make the median steadier.
MIX_LONGER = 4
# The same-work mix (the mix without the idempotent POST, which only ours protects) is the
# figure for the routes both stacks serve alike; it sits further from 1.0, so half as long.
SAME_WORK_LONGER = 2
SAME_WORK = "mix_same"
MIXES = ("mix", SAME_WORK)
WARMUP_SLOTS = 2  # sign-ins, pools, script loads


class Monitor:
    """Counts the commands clients send to one Redis (MONITOR), scripts' inner calls apart."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.sock.sendall(b"MONITOR\r\n")
        self.client = self.script = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self) -> None:
        buffer = b""
        while not self.stop.is_set():
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\r\n")
            for line in lines:
                if b" [0 lua] " in line:
                    self.script += 1
                elif line.startswith(b"+") and b"] " in line:
                    self.client += 1

    def close(self) -> int:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()
        return self.client


def _redis_cpu(stack: Any) -> float:
    info = stack.redis.client().info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _cpu(stack: Any) -> dict[str, float]:
    """CPU seconds used so far by the stack's redis-server and by its gunicorn (master and
    workers, every thread)."""
    from soak.processes import cpu_seconds

    return {"redis": _redis_cpu(stack), "app": cpu_seconds(stack.server.process.pid)}


LOADS = {
    "lean": "the lean load (one event loop, 16 devices)",
    "soak": "the soak's load (http.client, 4 processes x 4 devices)",
}


def _load_kind() -> str:
    """Which load generator drives the run (``E2E_LOAD``): ``lean`` (default) or ``soak``."""
    choice = os.environ.get("E2E_LOAD", "lean")
    if choice not in LOADS:
        raise SystemExit(f"E2E_LOAD must be one of {', '.join(LOADS)}, not {choice!r}")
    return choice


# The cores the load runs on (the pinned configuration: Redis's core); None: any core.
LOAD_CPUS: set[int] | None = None


def start_load(owned: Any, ports: list[int], seconds: float, outdir: Path,
               mix: dict[str, int]) -> Any:
    """16 signed-in devices, closed loop, alternating between ``ports`` every SLOT."""
    if _load_kind() == "lean":
        return e2e_load.start_lean_load(owned, ports, seconds, outdir, mix=mix,
                                        slot_seconds=SLOT, cpus=LOAD_CPUS)
    from soak.run import start_load as start_soak_load

    load = start_soak_load(owned, ports[0], seconds, outdir, procs=4, threads=4,
                           mode="bench", mix=mix, other_ports=ports[1:], slot_seconds=SLOT)
    if LOAD_CPUS:
        for process in load.processes:
            _pin(process.pid, LOAD_CPUS)
    return load


def _scenario(owned: Any, stacks: dict[str, Any], mix: dict[str, int], seconds: float,
              outdir: Path, cpu: dict[str, dict[str, float]] | None = None
              ) -> list[dict[str, Any]]:
    """One load alternating between the stacks every SLOT; its events. ``cpu`` gets each
    stack's redis-server and app CPU seconds per request (``cpu[stack]["redis"]``,
    ``["app"]``)."""
    ports = [stacks[name].server.port for name in STACKS]
    before = {name: _cpu(stacks[name]) for name in STACKS}
    load = start_load(owned, ports, seconds, outdir, mix)
    events = load.collect()
    for e in events:
        e["t_rel"] = e["s"] - load.t0
    if cpu is not None:
        for i, name in enumerate(STACKS):
            served = sum(1 for e in events if e.get("tg", 0) == i and e["st"])
            after = _cpu(stacks[name])
            cpu[name] = {part: (after[part] - before[name][part]) / max(served, 1)
                         for part in after}
    return events


def _commands(owned: Any, stacks: dict[str, Any], mix: dict[str, int],
              outdir: Path) -> dict[str, float]:
    """A separate short pass under MONITOR (it slows Redis, so not while timing): commands
    sent per request from the common start on (the devices' sign-ins before it are not
    counted), scripts' inner calls not counted."""
    monitors = {name: Monitor(stacks[name].redis.port) for name in STACKS}
    load = start_load(owned, [stacks[name].server.port for name in STACKS], 8 * SLOT, outdir,
                      mix)
    before = {name: m.client for name, m in monitors.items()}
    events = load.collect()
    time.sleep(0.3)
    counts = {name: m.close() - before[name] for name, m in monitors.items()}
    return {name: counts[name] / max(1, sum(1 for e in events if e.get("tg", 0) == i))
            for i, name in enumerate(STACKS)}


def _per_route(events: list[dict[str, Any]], seconds: float, commands: dict[str, float],
               cpu: dict[str, dict[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
    """stats[stack][route] = requests/s (median of rounds), p50 ms, errors, commands/req."""
    slots = int(seconds // SLOT)
    out: dict[str, dict[str, dict[str, float]]] = {name: {} for name in STACKS}
    for index, name in enumerate(STACKS):
        mine = [e for e in events if e.get("tg", 0) == index and e["st"] and e["k"] in ROUTES
                and e["t_rel"] >= WARMUP_SLOTS * SLOT]
        for route in (*ROUTES, "all"):
            evs = [e for e in mine if route == "all" or e["k"] == route]
            if not evs:
                continue
            per_slot = [0] * slots
            for e in evs:
                per_slot[min(int(e["t_rel"] // SLOT), slots - 1)] += 1
            rounds = [n / SLOT for i, n in enumerate(per_slot)
                      if i >= WARMUP_SLOTS and i % len(STACKS) == index]
            out[name][route] = {
                "rps": statistics.median(rounds) if rounds else 0.0,
                "p50": 1000 * statistics.median(e["r"] - e["s"] for e in evs),
                "errors": sum(1 for e in evs if e["st"] >= 400),
                "commands": commands[name],
                "redis_us": 1e6 * cpu[name]["redis"],
                "app_us": 1e6 * cpu[name]["app"],
            }
    return out


CONFIGS = {
    "shared": "shared cores (app, load and Redis on every core)",
    "pinned": "the app pinned to a core of its own (Redis and the load on the other)",
}


def _configs() -> list[str]:
    choice = os.environ.get("E2E_PINNED", "both")
    picks = {"both": ["shared", "pinned"], "0": ["shared"], "1": ["pinned"]}
    if choice not in picks:
        raise SystemExit(f"E2E_PINNED must be one of {', '.join(picks)}, not {choice!r}")
    return picks[choice]


def _memory() -> str:
    """Which opt-in process memories ours runs with (``E2E_MEMORY``): ``sessions,cache``
    (default), ``sessions``, ``cache`` or ``none`` (every feature at its defaults)."""
    choice = os.environ.get("E2E_MEMORY", "sessions,cache")
    names = {name for name in choice.split(",") if name and name != "none"}
    if names - {"sessions", "cache"}:
        raise SystemExit(f"E2E_MEMORY lists sessions, cache or none, not {choice!r}")
    return ",".join(sorted(names))


def _same() -> str:
    """The calibration (``E2E_SAME``): the stack both servers run, or "" (ours against
    theirs, the default)."""
    choice = os.environ.get("E2E_SAME", "")
    if choice not in ("", *STACKS):
        raise SystemExit(f"E2E_SAME must be one of {', '.join(STACKS)}, not {choice!r}")
    return choice


def _scenarios() -> list[str]:
    """The scenarios to run (``E2E_SCENARIOS``, comma-separated): every one by default."""
    known = [*MIXES, *ROUTES]
    choice = [name for name in os.environ.get("E2E_SCENARIOS", "").split(",") if name]
    if set(choice) - set(known):
        raise SystemExit(f"E2E_SCENARIOS lists {', '.join(known)}, not {choice!r}")
    return choice or known


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (what ``taskset -a -p`` does)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def _parser() -> str:
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis" if HIREDIS_AVAILABLE else "redis-py's own parser (no hiredis)"


def run() -> None:
    seconds = float(os.environ.get("E2E_SECONDS", "48"))
    profile_seconds = float(os.environ.get("E2E_PROFILE_SECONDS", "20"))
    for n, config in enumerate(_configs()):
        run_config(config, seconds, profile_seconds if n == 0 else 0)


def run_config(config: str, seconds: float, profile_seconds: float) -> None:
    """Fresh servers in one configuration, every scenario, its table (and the profile)."""
    from soak.load import BENCH_MIX
    from soak.processes import Owned
    from soak.run import Stack

    scenarios: dict[str, dict[str, int]] = {
        "mix": dict(BENCH_MIX),
        SAME_WORK: {route: n for route, n in BENCH_MIX.items() if route != "order"},
    }
    scenarios.update({route: {route: 1} for route in ROUTES})
    scenarios = {name: mix for name, mix in scenarios.items() if name in _scenarios()}
    global LOAD_CPUS
    every_cpu = os.sched_getaffinity(0)
    redis_cpu = {max(every_cpu)}
    if config == "pinned":
        if len(every_cpu) < 2:
            print("\n(one core only: no pinned configuration)")
            return
        os.sched_setaffinity(0, every_cpu - redis_cpu)  # the gunicorns inherit it
        LOAD_CPUS = redis_cpu
    owned = Owned()
    outdir = Path(tempfile.mkdtemp(prefix="rp-e2e-"))
    try:
        env = {"SOAK_BENCH": "1", "SOAK_MEMORY": _memory()}
        stacks = {name: Stack(owned, "gunicorn", stack=_same() or name, env=env)
                  for name in STACKS}
        if config == "pinned":
            for stack in stacks.values():
                assert stack.redis.process is not None
                _pin(stack.redis.process.pid, redis_cpu)
        _scenario(owned, stacks, BENCH_MIX, 6, outdir)  # warm up both
        results = {}
        for scenario, mix in scenarios.items():
            cpu: dict[str, dict[str, float]] = {}
            length = seconds * _longer(scenario)
            events = _scenario(owned, stacks, mix, length, outdir, cpu)
            commands = _commands(owned, stacks, mix, outdir)
            results[scenario] = _per_route(events, length, commands, cpu)
        report(results, seconds, CONFIGS[config])
        if profile_seconds > 0 and not _same():
            profile(owned, stacks, profile_seconds, outdir)
    finally:
        owned.stop_all()
        os.sched_setaffinity(0, every_cpu)
        LOAD_CPUS = None


def _longer(scenario: str) -> int:
    """How many times a route's length ``scenario`` runs."""
    return {"mix": MIX_LONGER, SAME_WORK: SAME_WORK_LONGER}.get(scenario, 1)


def report(results: dict[str, Any], seconds: float, config: str) -> None:
    memory = _memory() or "none (defaults)"
    print(f"\n## End to end, {config}: gunicorn 4x4 each, load alternating every "
          f"{SLOT:.0f} s, {seconds:.0f} s per route ({MIX_LONGER * seconds:.0f} s for the mix, "
          f"{SAME_WORK_LONGER * seconds:.0f} s for {SAME_WORK}: the mix without POST /orders), "
          f"{LOADS[_load_kind()]}, "
          f"replies parsed by {_parser()}, "
          f"ours' process memories: {memory} "
          "(medians over the rounds; ratio = ours/theirs, > 1 is ours faster)")
    if _same():
        print(f"CALIBRATION: both servers run {_same()}'s stack (\"ours\" is the first copy): "
              "every ratio is the benchmark's own noise")
    print(f"{'scenario':<11} {'route':<40} {'ours req/s':>10} {'theirs':>7} {'ratio':>6} "
          f"{'ours p50 ms':>11} {'theirs':>7} {'ratio':>6} {'cmds/req ours/theirs':>21} "
          f"{'Redis CPU us/req':>17} {'app CPU us/req':>15} {'errors ours/theirs':>19}")
    for scenario, per in results.items():
        routes = ["all", *ROUTES] if scenario in MIXES else [scenario]
        for route in routes:
            ours, theirs = per["ours"].get(route), per["theirs"].get(route)
            if not ours or not theirs:
                continue
            label = "every route" if route == "all" else ROUTES[route]
            whole = route in ("all", scenario)
            cmds = f"{ours['commands']:.2f} / {theirs['commands']:.2f}" if whole else ""
            us = f"{ours['redis_us']:.0f} / {theirs['redis_us']:.0f}" if whole else ""
            app = f"{ours['app_us']:.0f} / {theirs['app_us']:.0f}" if whole else ""
            print(f"{scenario:<11} {label:<40} {ours['rps']:>10,.0f} {theirs['rps']:>7,.0f} "
                  f"{ours['rps'] / max(theirs['rps'], 1e-9):>6.2f} {ours['p50']:>11.1f} "
                  f"{theirs['p50']:>7.1f} {theirs['p50'] / max(ours['p50'], 1e-9):>6.2f} "
                  f"{cmds:>21} {us:>17} {app:>15} "
                  f"{ours['errors']:>11.0f} / {theirs['errors']:<5.0f}")


def profile(owned: Any, stacks: dict[str, Any], seconds: float, outdir: Path) -> None:
    from soak.load import BENCH_MIX

    keep = Path(__file__).resolve().parent.parent / ".benchmarks"
    keep.mkdir(exist_ok=True)
    for name, stack in stacks.items():
        for idle in (False, True):
            raw = keep / f"e2e-profile-{name}-{'wall' if idle else 'cpu'}.txt"
            load = start_load(owned, [stack.server.port], seconds + 4, outdir,
                              dict(BENCH_MIX))
            time.sleep(2.5)  # devices signed in, load steady
            ok = e2e_profile.record(stack.server.process.pid, seconds, raw, idle=idle)
            load.collect()
            if not ok:
                print("\npy-spy is not installed (pip install py-spy): no profile")
                return
            what = "wall time (incl. waiting for Redis)" if idle else "CPU"
            print("\n".join(e2e_profile.table(f"{name}: {what}, mix", raw)))
            if name == "ours":
                print("\n".join(e2e_profile.hot_functions(raw)))
            print(f"(raw samples: {raw})")
