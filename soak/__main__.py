"""``./dev soak [--short] [--servers gunicorn,uvicorn] [--out DIR]``.

Runs the soak app on each server under the checking load and the fault timeline, writes
``DIR/report.md`` and ``DIR/latency.png``, and exits 1 when any promise broke (2 when the
soak itself could not run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from soak import report, run
from soak.processes import ROOT


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./dev soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true",
                        help="about a minute in all (CI): short phases, same faults")
    parser.add_argument("--cluster", action="store_true",
                        help="against a 3-master Redis Cluster with replicas, while slots "
                             "migrate, masters fail over and a fourth master joins")
    parser.add_argument("--servers", default=None,
                        help="comma-separated: gunicorn (4 workers x 4 threads), uvicorn (4)")
    parser.add_argument("--procs", type=int, default=4, help="load processes (default 4)")
    parser.add_argument("--threads", type=int, default=4,
                        help="devices per load process (default 4)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default .soak/short or .soak/full)")
    parser.add_argument("--keep-events", action="store_true",
                        help="also write every answer to events-<server>.jsonl.gz")
    parser.add_argument("--memory", default="",
                        help="ours with session loads from process memory: 'sessions' "
                             "(logout_everywhere is then checked against its 0.5 s bound)")
    args = parser.parse_args(argv)
    if args.memory not in ("", "sessions"):
        parser.error(f"--memory takes 'sessions', not {args.memory!r}")
    os.environ["SOAK_MEMORY"] = args.memory  # the app servers and the checks read it
    variant = ("cluster-" if args.cluster else "") + ("short" if args.short else "full")
    if args.cluster:
        from soak import cluster

        timeline = cluster.SHORT if args.short else cluster.FULL
    else:
        timeline = run.SHORT if args.short else run.FULL
    outdir = args.out or ROOT / ".soak" / variant
    # On Cluster one server by default: the faults are Redis's, and the cluster's six
    # redis-servers already share the machine with the load.
    default = "gunicorn" if args.cluster else "gunicorn,uvicorn"
    servers = [s.strip() for s in (args.servers or default).split(",") if s.strip()]
    signal.signal(signal.SIGTERM, _interrupted)
    started = time.monotonic()
    results = []
    try:
        for server in servers:
            result = run.run_server(server, timeline, procs=args.procs, threads=args.threads,
                                    log=lambda line: print(line, flush=True),
                                    keep=outdir if args.keep_events else None,
                                    cluster=args.cluster)
            results.append(result)
            for finding in result.findings:
                mark = "ok    " if finding.ok else "BROKEN"
                print(f"[{server}] {mark} {finding.promise}: {finding.summary}", flush=True)
                if not finding.ok:
                    for example in finding.examples[:6]:
                        print(f"[{server}]          - {example}", flush=True)
            if args.keep_events:
                outdir.mkdir(parents=True, exist_ok=True)
                with gzip.open(outdir / f"events-{server}.jsonl.gz", "wt") as f:
                    for event in result.events:
                        f.write(json.dumps(event) + "\n")
                (outdir / f"run-{server}.json").write_text(json.dumps(
                    {"t0": result.t0, "phases": result.phases, "servers": result.servers,
                     "runlog": result.runlog}))
    except KeyboardInterrupt:
        print("soak: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    page = report.write(results, outdir, variant)
    ok = all(r.ok for r in results)
    broken = sorted({f"[{r.server}] {f.promise}" for r in results
                     for f in r.findings if not f.ok})
    print(f"soak ({variant}, {time.monotonic() - started:.0f} s): "
          f"{'every promise held' if ok else 'BROKEN PROMISES: ' + '; '.join(broken)}; "
          f"report: {page}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except RuntimeError as exc:
        print(f"soak could not run: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
