"""End to end: the soak app on gunicorn, ours against the stack users replace.

Two gunicorns (4 workers x 4 threads each) serve the same app (``soak/app``), each with its
own redis-server: **ours** (our cache backend, session engine with SessionActivityMiddleware,
``@ratelimit`` / ``RateLimitMiddleware``, ``IdempotencyMiddleware``) and **theirs**
(django-redis's cache, Django's cache session engine, django-ratelimit's fixed window, no
idempotency layer). The same closed-loop load (4 processes x 4 devices, signed in) runs
against one, then the other, alternating which goes first, for every scenario: the mix,
then each route alone. Rate limits are set so high that every request is admitted: the
benchmark measures the admitted path, not 429s. We report medians over the rounds and
ratios ours/theirs (> 1: ours is faster). Then py-spy samples the workers of each stack
under the mix, and the samples are charged to the layer that spent them.

``E2E_ROUNDS`` (3) and ``E2E_SECONDS`` (6) set the rounds per scenario and their length;
``E2E_PROFILE_SECONDS`` (15, 0 = no profile) the profile's length.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import e2e_profile

ROUTES = {
    "me": "GET /me (signed in)",
    "rl_fixed": "GET /rl/fixed (ours fixed window)",
    "rl_sliding": "GET /rl/sliding (ours sliding window)",
    "rl_gcra": "GET /rl/gcra (ours token bucket)",
    "api_rule": "GET /api/echo (ours: middleware rule)",
    "cached": "GET /cached (get_or_set hit)",
    "order": "POST /orders (ours: Idempotency-Key)",
}
STACKS = ("ours", "theirs")


def _round(owned: Any, stack: Any, mix: dict[str, int], seconds: float, seed: int,
           outdir: Path) -> tuple[list[dict[str, Any]], int]:
    """One round of load; returns its answers and how many Redis commands it cost."""
    from soak.run import run_load

    client = stack.redis.client()
    client.config_resetstat()
    events = run_load(owned, stack.server.port, seconds, outdir, procs=4, threads=4,
                      mode="bench", seed=seed, mix=mix)
    stats = client.info("commandstats")
    commands = sum(int(v["calls"]) for k, v in stats.items()
                   if k not in ("cmdstat_config|resetstat", "cmdstat_info"))
    return events, commands


def _stats(events: list[dict[str, Any]], seconds: float,
           commands: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for route in ROUTES:
        evs = [e for e in events if e["k"] == route and e["st"]]
        if not evs:
            continue
        bad = sum(1 for e in evs if e["st"] >= 400)
        out[route] = {"rps": len(evs) / seconds,
                      "p50": 1000 * statistics.median(e["r"] - e["s"] for e in evs),
                      "errors": bad}
    answered = [e for e in events if e["st"] and e["k"] in ROUTES]
    out["all"] = {"rps": len(answered) / seconds,
                  "p50": 1000 * statistics.median(e["r"] - e["s"] for e in answered)
                  if answered else 0.0,
                  "errors": sum(1 for e in answered if e["st"] >= 400),
                  # Redis commands per request (the round's sign-ins included)
                  "commands": commands / max(len(answered), 1)}
    return out


def run() -> None:
    from soak.load import BENCH_MIX
    from soak.processes import Owned
    from soak.run import Stack

    rounds = int(os.environ.get("E2E_ROUNDS", "3"))
    seconds = float(os.environ.get("E2E_SECONDS", "6"))
    profile_seconds = float(os.environ.get("E2E_PROFILE_SECONDS", "15"))
    scenarios: dict[str, dict[str, int]] = {"mix": dict(BENCH_MIX)}
    scenarios.update({route: {route: 1} for route in ROUTES})
    owned = Owned()
    outdir = Path(tempfile.mkdtemp(prefix="rp-e2e-"))
    try:
        stacks = {name: Stack(owned, "gunicorn", stack=name, env={"SOAK_BENCH": "1"})
                  for name in STACKS}
        for stack in stacks.values():  # warm up: imports, pools, scripts, sign-ins
            _round(owned, stack, BENCH_MIX, 3, 99, outdir)
        # results[scenario][stack][route] = list of per-round stats. Every round visits
        # every scenario, so a noisy minute on the shared machine hits them all alike.
        results: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
            scenario: {s: {} for s in STACKS} for scenario in scenarios}
        for i in range(rounds):
            for scenario, mix in scenarios.items():
                order = STACKS if i % 2 == 0 else STACKS[::-1]
                for name in order:
                    events, commands = _round(owned, stacks[name], mix, seconds, i, outdir)
                    for route, values in _stats(events, seconds, commands).items():
                        results[scenario][name].setdefault(route, []).append(values)
        report(results, rounds, seconds)
        if profile_seconds > 0:
            profile(owned, stacks, profile_seconds, outdir)
    finally:
        owned.stop_all()


def _median(rows: list[dict[str, float]], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def report(results: dict[str, Any], rounds: int, seconds: float) -> None:
    print(f"\n## End to end: gunicorn 4x4, {rounds} alternating rounds of {seconds:.0f} s per "
          "scenario (medians; ratio = ours/theirs, > 1 is ours faster)")
    header = (f"{'scenario':<12} {'route':<40} {'ours req/s':>10} {'theirs':>8} {'ratio':>6} "
              f"{'ours p50 ms':>11} {'theirs':>7} {'ratio':>6} {'Redis cmds/req':>15} "
              f"{'errors':>7}")
    print(header)
    for scenario, per in results.items():
        routes = ["all", *ROUTES] if scenario == "mix" else [scenario]
        for route in routes:
            ours, theirs = per["ours"].get(route), per["theirs"].get(route)
            if not ours or not theirs:
                continue
            o_rps, t_rps = _median(ours, "rps"), _median(theirs, "rps")
            o_p50, t_p50 = _median(ours, "p50"), _median(theirs, "p50")
            errors = sum(r["errors"] for r in ours + theirs)
            label = "every route" if route == "all" else ROUTES[route]
            cmds = (f"{_median(per['ours']['all'], 'commands'):.2f} / "
                    f"{_median(per['theirs']['all'], 'commands'):.2f}"
                    if route in ("all", scenario) else "")
            print(f"{scenario:<12} {label:<40} {o_rps:>10,.0f} {t_rps:>8,.0f} "
                  f"{o_rps / t_rps:>6.2f} {o_p50:>11.1f} {t_p50:>7.1f} {t_p50 / o_p50:>6.2f} "
                  f"{cmds:>15} {errors:>7}")


def profile(owned: Any, stacks: dict[str, Any], seconds: float, outdir: Path) -> None:
    from soak.load import BENCH_MIX
    from soak.run import start_load

    keep = Path(__file__).resolve().parent.parent / ".benchmarks"
    keep.mkdir(exist_ok=True)
    for name, stack in stacks.items():
        for idle in (False, True):
            raw = keep / f"e2e-profile-{name}-{'wall' if idle else 'cpu'}.txt"
            load = start_load(owned, stack.server.port, seconds + 4, outdir, procs=4,
                              threads=4, mode="bench", mix=dict(BENCH_MIX))
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
