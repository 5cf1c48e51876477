"""The soak's report: a Markdown page a user can read, and a latency-over-time plot."""

from __future__ import annotations

import platform
import statistics
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soak import config
from soak.processes import ROOT
from soak.run import RunResult

ROUTE_GROUPS = {
    "sessions": ("me", "signin", "logout"),
    "rate limits": ("rl_fixed", "rl_sliding", "rl_gcra", "api_rule"),
    "cache": ("cached", "cached_swr"),
    "idempotency": ("order",),
}
ROUTE_LABELS = {
    "me": "GET /me", "signin": "POST /signin", "logout": "POST /logout-everywhere",
    "rl_fixed": "GET /rl/fixed (fixed window)", "rl_sliding": "GET /rl/sliding (sliding window)",
    "rl_gcra": "GET /rl/gcra (token bucket)", "api_rule": "GET /api/echo (middleware rule)",
    "cached": "GET /cached (STALE_TTL 0)", "cached_swr": "GET /cached-swr (STALE_TTL 3)",
    "order": "POST /orders (Idempotency-Key)",
}
STATUS_COLUMNS = (200, 201, 401, 409, 429, 503)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_cells(events: Sequence[dict[str, Any]]) -> str:
    ms = [1000 * (e["r"] - e["s"]) for e in events if e["st"]]
    if not ms:
        return "| | | | "
    return (f"| {statistics.median(ms):,.0f} | {percentile(ms, 0.99):,.0f} "
            f"| {max(ms):,.0f} | {max((e.get('el') or 0) for e in events) * 1000:,.0f} ")


def status_cells(events: Sequence[dict[str, Any]]) -> str:
    counts = Counter(e["st"] for e in events)
    other = sum(n for st, n in counts.items() if st not in STATUS_COLUMNS and st != 0)
    cells = [f"{counts.get(st, 0):,}" if counts.get(st) else "" for st in STATUS_COLUMNS]
    return "| " + " | ".join(cells) + f" | {other or ''} | {counts.get(0, '') or ''} "


TABLE_HEAD = ("| 200 | 201 | 401 | 409 | 429 | 503 | other | no answer "
              "| p50 ms | p99 ms | max ms | max in Django ms |")
TABLE_RULE = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def phase_table(result: RunResult) -> list[str]:
    lines = [f"| phase | s | requests | req/s {TABLE_HEAD}", f"|---|---:|---:|---:{TABLE_RULE}"]
    for phase in result.phases:
        evs = [e for e in result.events if phase["start"] <= e["s"] < phase["end"]]
        seconds = phase["end"] - phase["start"]
        lines.append(f"| {phase['name']} | {seconds:.1f} | {len(evs):,} | "
                     f"{len(evs) / max(seconds, 1e-9):,.0f} {status_cells(evs)}"
                     f"{latency_cells(evs)}|")
    return lines


def route_table(result: RunResult) -> list[str]:
    lines = [f"| route | requests {TABLE_HEAD}", f"|---|---:{TABLE_RULE}"]
    for route, label in ROUTE_LABELS.items():
        evs = [e for e in result.events if e["k"] == route]
        if evs:
            lines.append(f"| {label} | {len(evs):,} {status_cells(evs)}{latency_cells(evs)}|")
    return lines


def redis_line(r: RunResult) -> str:
    ping = r.servers.get("ping") or {}
    stalls = r.servers.get("stalls") or []
    line = (f"Redis outside the injected faults (a PING every 20 ms): p50 "
            f"{ping.get('p50_ms', 0):.1f} ms, p99 {ping.get('p99_ms', 0):.1f} ms, max "
            f"{ping.get('max_ms', 0):.0f} ms.")
    if stalls:
        longest = max(b - a for a, b in stalls)
        line += (f" **{len(stalls)} PINGs took longer than "
                 f"{0.8 * config.SOCKET_TIMEOUT:.1f} s** (longest {longest:.2f} s, from "
                 f"t={stalls[0][0] - r.t0:.1f} s): the machine starved Redis; requests then "
                 "followed the outage policies, and the checks count those moments as faults.")
    worker = r.servers.get("worker_stalls") or []
    if worker:
        longest = max(b - a for a, b in worker)
        line += (f" **A server worker was not scheduled for over 0.25 s {len(worker)} times** "
                 f"(longest {longest:.2f} s): requests in flight then may time out although "
                 "Redis answered; these moments count as faults too.")
    return line


def plot(results: Sequence[RunResult], path: Path, dpi: int = 110) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(12, 3.6 * len(results)), squeeze=False)
    colors = {"sessions": "tab:blue", "rate limits": "tab:green", "cache": "tab:orange",
              "idempotency": "tab:purple"}
    for ax, result in zip(axes[:, 0], results, strict=True):
        for phase in result.phases:
            if phase["fault"]:
                ax.axvspan(phase["start"] - result.t0, phase["end"] - result.t0,
                           color="tab:red", alpha=0.15, lw=0)
                ax.text(phase["start"] - result.t0, 1.02, phase["name"], fontsize=7,
                        rotation=0, transform=ax.get_xaxis_transform(), color="tab:red")
        for group, routes in ROUTE_GROUPS.items():
            evs = [e for e in result.events if e["k"] in routes and e["st"]]
            ax.scatter([e["s"] - result.t0 for e in evs],
                       [max(e["r"] - e["s"], 1e-4) * 1000 for e in evs],
                       s=2, alpha=0.35, color=colors[group], label=group, rasterized=True)
        lost = [e for e in result.events if not e["st"]]
        if lost:
            ax.scatter([e["s"] - result.t0 for e in lost], [1000 * (e["r"] - e["s"]) for e in lost],
                       s=12, marker="x", color="black", label="no answer")
        ax.axhline(config.HANG_BOUND * 1000, color="tab:red", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{result.server}: latency of every request", fontsize=10, loc="left",
                     pad=14)
        ax.legend(loc="upper right", fontsize=7, markerscale=4)
    axes[-1, 0].set_xlabel("seconds since the load started (red: faults; dashed: the hang bound)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def environment() -> str:
    import django
    import django_redis
    import redis

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        commit = "?"
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                            timeout=10).stdout.split()
    version = next((w[2:] for w in server if w.startswith("v=")), "?")
    import os

    return (f"commit {commit or '?'}; Python {platform.python_version()}, Django "
            f"{django.__version__}, django-redis {django_redis.__version__}, redis-py "
            f"{redis.__version__}, redis-server {version}; {os.cpu_count()} cores")


def markdown(results: Sequence[RunResult], variant: str, plot_name: str) -> str:
    out = [f"# Soak report ({variant})", ""]
    out.append(environment() + ".")
    out.append("")
    first = results[0]
    out.append(
        f"Load: {first.load}, against each server on loopback. Settings as the docs say: "
        f"socket timeout {config.SOCKET_TIMEOUT} s, `IGNORE_EXCEPTIONS` on the cache, "
        f"`STALE_TTL` 0 (`/cached`) and {config.STALE_TTL['swr']} s (`/cached-swr`), cache "
        f"timeout {config.CACHE_TIMEOUT} s with a {config.COMPUTE_SECONDS * 1000:.0f} ms "
        f"compute, idempotency `LEASE` {config.IDEMPOTENCY_LEASE} s, Redis with "
        "`appendonly yes`, `appendfsync always`.")
    out.append("")
    verdict = "every promise held" if all(r.ok for r in results) else "some promises broke"
    out += [f"**Verdict: {verdict}.**", ""]
    out.append("| promise | " + " | ".join(r.server for r in results) + " |")
    out.append("|---|" + "---|" * len(results))
    for i, finding in enumerate(first.findings):
        cells = []
        for r in results:
            f = r.findings[i]
            cells.append(("held: " if f.ok else "**BROKEN**: ") + f.summary)
        out.append(f"| {finding.promise} | " + " | ".join(cells) + " |")
    out.append("")
    broken = [(r, f) for r in results for f in r.findings if not f.ok]
    if broken:
        out += ["## Broken promises", ""]
        for r, f in broken:
            out.append(f"- **{r.server} — {f.promise}**: {f.summary}")
            out += [f"    - {x}" for x in f.examples]
        out.append("")
    out += [f"![latency over time]({plot_name})", ""]
    for r in results:
        total = len(r.events)
        seconds = r.phases[-1]["end"] - r.phases[0]["start"]
        out += [f"## {r.server}", "",
                f"{total:,} requests in {seconds:.0f} s ({total / seconds:,.0f}/s); worker "
                f"PIDs {r.servers['workers_start']}; server log: {r.servers['log_warnings']:,} "
                f"warnings, {r.servers['log_errors']:,} errors, "
                f"{r.servers['tracebacks']:,} tracebacks (the documented outage logging).", "",
                redis_line(r), "",
                "### Per phase (by send time)", "", *phase_table(r), "",
                "### Per route", "", *route_table(r), ""]
    return "\n".join(out) + "\n"


def write(results: Sequence[RunResult], outdir: Path, variant: str) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    plot(results, outdir / "latency.png")
    page = outdir / "report.md"
    page.write_text(markdown(results, variant, "latency.png"))
    return page
