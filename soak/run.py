"""One soak run on one server: Redis, the app, the load, the fault timeline, the checks."""

from __future__ import annotations

import contextlib
import gzip
import json
import multiprocessing
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from soak import checks, config
from soak.load import CLIENT_TIMEOUT, LoadSpec, load_process
from soak.processes import AppServer, Owned, RedisProcess, Workdir

# (phase name, seconds, what happens at its start, is it a fault)
Phase = tuple[str, float, str | None, bool]
FULL: list[Phase] = [
    ("steady", 40, None, False),
    ("Redis hung (SIGSTOP 5 s)", 5, "hang", True),
    ("after SIGCONT", 30, "wake", False),
    ("Redis killed", 3, "kill", True),
    ("after restart without persistence", 30, "restart_empty", False),
    ("Redis killed again", 3, "kill", True),
    # At least the idempotency lease + margin: an orphaned claim must end before the stop.
    ("after restart from the AOF", 45, "restart_aof", False),
]
SHORT: list[Phase] = [
    ("steady", 5, None, False),
    ("Redis hung (SIGSTOP 5 s)", 5, "hang", True),
    ("after SIGCONT", 5, "wake", False),
    ("Redis killed", 1, "kill", True),
    ("after restart without persistence", 5, "restart_empty", False),
    ("Redis killed again", 1, "kill", True),
    ("after restart from the AOF", 14, "restart_aof", False),
]


CLUSTER_SLACK = 30.0  # seconds of extra load on Cluster, for slot moves that run long


@dataclass
class RunResult:
    server: str
    t0: float
    t_end: float
    phases: list[dict[str, Any]]
    events: list[dict[str, Any]]
    runlog: list[dict[str, Any]]
    servers: dict[str, Any]
    findings: list[checks.Finding] = field(default_factory=list)
    load: str = ""

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


class Stack:
    """A private Redis, the SQLite schema and one app server, all owned by ``owned``."""

    def __init__(self, owned: Owned, kind: str, *, stack: str = "ours",
                 env: dict[str, str] | None = None, workers: int = 4, threads: int = 4,
                 redis_server: Any = None) -> None:
        self.workdir = owned.add(Workdir()).path
        if redis_server is None:  # one private redis-server; else a started SoakCluster
            redis_server = owned.add(RedisProcess(self.workdir))
            redis_server.start()
        self.redis = redis_server
        self.runlog = self.workdir / "runlog"
        self.runlog.mkdir()
        self.env = {"SOAK_REDIS_URL": self.redis.url, "SOAK_DB": str(self.workdir / "db.sqlite3"),
                    "SOAK_RUNLOG": str(self.runlog), "SOAK_STACK": stack,
                    "DJANGO_SETTINGS_MODULE": "soak.app.settings", **(env or {})}
        boot = subprocess.run([sys.executable, "-m", "soak.app.bootstrap"],
                              env={**_base_env(), **self.env}, capture_output=True, text=True,
                              timeout=120)
        if boot.returncode:
            raise RuntimeError(f"bootstrap failed:\n{boot.stderr[-2000:]}")
        self.server = AppServer(kind, self.env, self.workdir, workers=workers, threads=threads)
        owned.add(self.server)
        self.server.wait_ready()

    def read_runlog(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted(self.runlog.glob("runlog-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        return records


def _base_env() -> dict[str, str]:
    import os

    from soak.processes import ROOT

    return {**os.environ, "PYTHONPATH": str(ROOT)}




class LoadRun:
    def __init__(self, processes: list[Any], outs: list[Path], t0: float, t_stop: float) -> None:
        self.processes = processes
        self.outs = outs
        self.t0 = t0
        self.t_stop = t_stop

    def __repr__(self) -> str:
        return f"load processes {[p.pid for p in self.processes]}"

    def collect(self) -> list[dict[str, Any]]:
        for p in self.processes:
            p.join(max(0.0, self.t_stop - time.time()) + CLIENT_TIMEOUT + 15)
        self.stop()
        events: list[dict[str, Any]] = []
        for out in self.outs:
            if not out.exists():
                raise RuntimeError(f"a load process wrote no events ({out})")
            events.extend(json.loads(line) for line in out.read_text().splitlines() if line)
        return events

    def stop(self) -> None:
        for p in self.processes:
            if p.is_alive():
                p.terminate()  # SIGTERM by its PID
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def start_together(owned: Owned, target: Any, specs: list[Any], outs: list[Path],
                   seconds: float) -> LoadRun:
    """Run ``target(spec, ready, start)`` in one spawned process per spec. Each process
    waits at ``ready`` twice: once when it is ready, once for ``start.value`` (the common
    start, set here). Returns at that start (``.t0``); the events are read from ``outs``."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(len(specs) + 1)
    start = ctx.Value("d", 0.0)
    for out in outs:
        out.unlink(missing_ok=True)
    processes = []
    for spec in specs:
        process = ctx.Process(target=target, args=(spec, ready, start), daemon=True)
        process.start()
        processes.append(process)
    run = owned.add(LoadRun(processes, outs, 0.0, 0.0))
    ready.wait(120)
    run.t0 = start.value = time.time() + 0.2
    run.t_stop = run.t0 + seconds
    ready.wait(120)
    return run


def start_load(owned: Owned, port: int, seconds: float, outdir: Path, *,
               procs: int, threads: int, mode: str = "soak", seed: int = 0,
               mix: dict[str, int] | None = None, other_ports: list[int] | None = None,
               slot_seconds: float = 1.0) -> LoadRun:
    """Start ``procs`` load processes; once all are ready they start together, for
    ``seconds``. Returns at that start (``.t0``)."""
    outs = [outdir / f"events-{i}.jsonl" for i in range(procs)]
    specs = [LoadSpec(port=port, duration=seconds, proc=i, threads=threads, out=str(out),
                      mode=mode, seed=seed, mix=mix or {}, other_ports=other_ports or [],
                      slot_seconds=slot_seconds)
             for i, out in enumerate(outs)]
    return start_together(owned, load_process, specs, outs, seconds)


def run_server(kind: str, timeline: list[Phase], *, procs: int = 4, threads: int = 4,
               log: Any = print, keep: Path | None = None, cluster: bool = False) -> RunResult:
    """The soak on one server (``gunicorn`` or ``uvicorn``); every process stopped after.

    ``cluster``: against a Redis Cluster started here (:mod:`soak.cluster`)."""
    owned = Owned()
    try:
        log(f"[{kind}] starting Redis{' Cluster' if cluster else ''} and {kind} ...")
        topology = None
        if cluster:
            from soak import cluster as soak_cluster

            topology = owned.add(soak_cluster.SoakCluster(full=timeline == soak_cluster.FULL))
        stack = Stack(owned, kind, redis_server=topology)
        # Cluster actions (slot moves) can outlast their phase: each phase then starts
        # late but keeps its length, and the load runs long enough for that.
        slack = CLUSTER_SLACK if cluster else 0.0
        load = start_load(owned, stack.server.port, sum(p[1] for p in timeline) + slack,
                          stack.workdir, procs=procs, threads=threads)
        t0 = load.t0
        probe = owned.add(RedisProbe(stack.redis))
        phases = _play(timeline, stack.redis, t0, kind, log, stack.runlog, stretch=cluster)
        log(f"[{kind}] load stops; collecting answers ...")
        events = load.collect()
        probe.stop()
        t_end = time.time()
        servers: dict[str, Any] = {
            "workers_start": stack.server.worker_pids,
            "workers_end": stack.server.current_workers(),
            "workers_served": sorted({e["w"] for e in events if e.get("w")}),
            "ttl_audit": (topology.ttl_audit() if topology is not None
                          else ttl_audit(stack.redis.client())),
        }
        if topology is not None:
            servers["crossslot"] = topology.crossslot_errors()
            servers["cluster_log"] = topology.log
        owned.stoppers.remove(stack.server)
        stack.server.stop()
        servers.update(read_server_log(stack.server.log, kind, len(stack.server.worker_pids)))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            with stack.server.log.open("rb") as src, \
                    gzip.open(keep / f"{kind}.log.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        runlog = stack.read_runlog()
        result = RunResult(kind, t0, t_end, phases, events, runlog, servers,
                           load=f"{procs} processes x {threads} devices, closed loop")
        # Without persistence the data is gone from the kill before the restart on.
        # On Cluster, what a killed master had not replicated may be gone likewise.
        lost = [(phases[i - 1]["start"], p["start"]) for i, p in enumerate(phases)
                if p["action"] in ("restart_empty", "promoted")]
        tl = checks.Timeline(phases, lost)
        tl.stalls = probe.stalls(tl)
        servers["stalls"] = list(tl.stalls)
        servers["worker_stalls"] = [(r["start"], r["end"]) for r in runlog if r["kind"] == "stall"]
        tl.stalls += servers["worker_stalls"]
        servers["ping"] = probe.summary(tl)
        result.findings = checks.check_all(events, runlog, tl, t0, t_end, servers)
        if topology is not None:
            result.findings.append(checks.Finding(
                "no CROSSSLOT", servers["crossslot"] == 0,
                f"{servers['crossslot']} CROSSSLOT errors counted by the cluster's nodes", []))
        return result
    finally:
        owned.stop_all()


def _play(timeline: list[Phase], server: Any, t0: float, kind: str,
          log: Any, runlog: Path, stretch: bool = False) -> list[dict[str, Any]]:
    in_flight = ComputeWatch(runlog)
    phases: list[dict[str, Any]] = []
    at = t0
    for name, seconds, action, fault in timeline:
        _sleep_until(at)
        if action in ("hang", "kill", "kill_master", "failover"):
            in_flight.wait()
        before = time.time()
        if action is not None:
            getattr(server, {"restart_aof": "restart_from_aof"}.get(action, action))()
        # A fault starts when it is sent; a recovery when the restart is complete.
        started = before if fault else time.time()
        if phases:
            phases[-1]["end"] = started
        phases.append({"name": name, "start": started, "end": started + seconds,
                       "fault": fault, "action": action})
        log(f"[{kind}] t={started - t0:5.1f}s  {name}")
        at = (max(at, time.time()) if stretch else at) + seconds
    _sleep_until(at)
    phases[-1]["end"] = max(time.time(), phases[-1]["start"])
    return phases


class RedisProbe:
    """PINGs Redis every 20 ms on its own connection: when did Redis answer slower than
    the app's socket timeout without an injected fault?"""

    STALL = 0.8 * config.SOCKET_TIMEOUT

    def __init__(self, server: RedisProcess) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=3,
                                  socket_connect_timeout=1)
        self.samples: list[tuple[float, float]] = []  # (sent, seconds until answer or error)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def __repr__(self) -> str:
        return "Redis probe"

    def loop(self) -> None:
        while not self.done.wait(0.02):
            sent = time.time()
            with contextlib.suppress(redis.RedisError):
                self.client.ping()
            self.samples.append((sent, time.time() - sent))

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)

    def stalls(self, tl: checks.Timeline) -> list[tuple[float, float]]:
        return [(sent, sent + took) for sent, took in self.samples
                if took >= self.STALL and not tl.in_fault(sent, sent + took)]

    def summary(self, tl: checks.Timeline) -> dict[str, float]:
        calm = sorted(took for sent, took in self.samples if not tl.in_fault(sent, sent + took))
        if not calm:
            return {}
        return {"samples": len(calm), "p50_ms": 1000 * calm[len(calm) // 2],
                "p99_ms": 1000 * calm[int(0.99 * (len(calm) - 1))], "max_ms": 1000 * calm[-1]}


class ComputeWatch:
    """Tails the views' run logs: a hang or a crash is sent while a ``get_or_set``
    computation is in flight, the moment that matters for the cache (the value is about to
    be stored, waiters are about to claim again). Waits at most ``patience`` seconds."""

    def __init__(self, runlog: Path, patience: float = 2.0) -> None:
        self.runlog = runlog
        self.patience = patience
        self.offsets: dict[Path, int] = {}

    def wait(self) -> bool:
        deadline = time.time() + self.patience
        self.latest()  # skip what was logged before now
        while time.time() < deadline:
            started = self.latest()
            if started is not None and time.time() - started < 0.03:
                return True
            time.sleep(0.002)
        return False

    def latest(self) -> float | None:
        newest = None
        for path in self.runlog.glob("runlog-*.jsonl"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                if b'"compute-start"' in line:
                    newest = max(newest or 0.0, json.loads(line)["start"])
        return newest


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.2))


def ttl_audit(client: redis.Redis) -> dict[str, Any]:
    """SCAN every key (never KEYS) and PTTL it: how many, per prefix, and any without TTL."""
    total = no_ttl = 0
    by_prefix: dict[str, int] = {}
    examples: list[str] = []
    batch: list[bytes] = []

    def flush() -> None:
        nonlocal no_ttl
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.pttl(key)
        for key, pttl in zip(batch, pipe.execute(), strict=True):
            if pttl == -1:
                no_ttl += 1
                if len(examples) < 10:
                    examples.append(key.decode(errors="replace"))
        batch.clear()

    for key in client.scan_iter(count=1000):
        total += 1
        parts = key.decode(errors="replace").split(":")
        prefix = ":".join(parts[:2]) if parts[0] == "soak" else parts[0]
        by_prefix[prefix] = by_prefix.get(prefix, 0) + 1
        batch.append(key)
        if len(batch) >= 1000:
            flush()
    if batch:
        flush()
    return {"keys": total, "no_ttl": no_ttl, "by_prefix": by_prefix, "examples": examples}


_WORKER_TROUBLE = re.compile(
    r"WORKER TIMEOUT|was sent SIGKILL|Worker \(pid:\d+\) (?:exited|was sent)|"
    r"Child process \[\d+\] died|Worker exiting|out of memory", re.IGNORECASE)


def read_server_log(path: Path, kind: str, workers: int) -> dict[str, Any]:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    boots = sum(1 for line in lines if "Booting worker" in line or "Started server process" in line)
    # The stop at the end makes workers exit; only what happened before it counts.
    stop_at = next((i for i, line in enumerate(lines)
                    if "Handling signal: term" in line or "Shutting down" in line), len(lines))
    problems = [line[:200] for line in lines[:stop_at] if _WORKER_TROUBLE.search(line)]
    if kind == "gunicorn" and boots > workers:
        problems.append(f"{boots} workers booted for {workers}")
    tracebacks = sum(1 for line in lines[:stop_at] if line.startswith("Traceback"))
    warnings = sum(1 for line in lines[:stop_at] if " WARNING " in line)
    errors = sum(1 for line in lines[:stop_at] if " ERROR " in line)
    return {"log_problems": problems, "tracebacks": tracebacks, "log_warnings": warnings,
            "log_errors": errors, "log_tail": lines[:stop_at][-20:]}
