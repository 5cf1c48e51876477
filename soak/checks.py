"""Every promise the soak checks, from the recorded answers and the views' run logs.

Times are the load generator's send / receive times (``s`` / ``r``, one machine, one
clock). A check only reports a violation that no ordering of events inside those bounds
could explain, so a slow machine makes the checks weaker, never wrong.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from soak import config

RECOVERY = 1.0  # seconds after a fault ends during which its effects are still expected
UNAVAILABLE_GRACE = 2.0
# The store lands a moment after the computation ends; a starved machine stretches that.
FRESHNESS_SLACK = 0.25  # a 503 this long after a fault ended means "not recovered"

# What each route may answer (anything else is a broken promise).
ALLOWED_STATUS = {
    "me": {200, 401, 503}, "signin": {200, 503}, "logout": {200, 401, 503},
    "rl_fixed": {200, 429}, "rl_sliding": {200, 429}, "rl_gcra": {200, 429},
    "api_rule": {200, 429}, "cached": {200}, "cached_swr": {200},
    "order": {201, 409, 503},
}


@dataclass
class Finding:
    promise: str
    ok: bool
    summary: str
    examples: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    """The phases as they really happened: dicts with name, start, end, fault (bool)."""

    phases: list[dict[str, Any]]
    # (kill, restart complete) of each restart without persistence: data written before the
    # restart completed may be gone when read after the kill.
    empty_restarts: list[tuple[float, float]]
    # Redis slower than the socket timeout without an injected fault (a starved machine):
    # the app then follows its outage policy, so these count as faults too, and are reported.
    stalls: list[tuple[float, float]] = field(default_factory=list)

    def fault_windows(self, margin: float = RECOVERY) -> list[tuple[float, float]]:
        injected = [(p["start"], p["end"] + margin) for p in self.phases if p["fault"]]
        return injected + [(a, b + margin) for a, b in self.stalls]

    def in_fault(self, t0: float, t1: float | None = None, margin: float = RECOVERY) -> bool:
        t1 = t0 if t1 is None else t1
        return any(a <= t1 and t0 <= b for a, b in self.fault_windows(margin))

    def landing(self, t0: float, t1: float) -> float:
        """Latest time a command sent in [t0, t1] may run: a hung Redis runs what it was
        sent when it wakes, after the client gave up."""
        return max([t1] + [b for a, b in self.fault_windows() if a <= t1 and t0 <= b])

    def restart_between(self, t0: float, t1: float) -> bool:
        """Could data written at ``t0`` be gone at ``t1``?"""
        return any(kill <= t1 and t0 <= done for kill, done in self.empty_restarts)

    def phase_of(self, t: float) -> str:
        for p in self.phases:
            if p["start"] <= t < p["end"]:
                return str(p["name"])
        return self.phases[-1]["name"] if t >= self.phases[-1]["end"] else self.phases[0]["name"]


def fmt_t(t: float, t0: float) -> str:
    return f"t={t - t0:.1f}s"


def check_all(events: list[dict[str, Any]], runlog: list[dict[str, Any]], tl: Timeline,
              t0: float, t_end: float, servers: dict[str, Any]) -> list[Finding]:
    return [
        check_statuses(events, tl, t0),
        check_answered(events, t0),
        check_workers(servers),
        check_hang_bound(events, tl, t0),
        check_rate_limits(events, tl, t0),
        *check_idempotency(events, runlog, tl, t0, t_end),
        *check_sessions(events, tl, t0),
        check_freshness(events, tl, t0),
        check_single_flight(runlog, tl, t0),
        check_ttls(servers),
    ]


# --- the whole mix --------------------------------------------------------------------------

# A session deleted while its request ran (here: by a restart without persistence) is
# answered 400, as Django's own engines do ("no resurrection", docs/sessions.md).
ALLOWED_IN_FAULT = {"me": {400}, "signin": {400}, "logout": {400}, "order": {400}}


def check_statuses(events: list[dict[str, Any]], tl: Timeline, t0: float) -> Finding:
    unexpected = [e for e in events
                  if e["st"] and e["st"] not in ALLOWED_STATUS.get(e["k"], set())
                  and not (e["st"] in ALLOWED_IN_FAULT.get(e["k"], set())
                           and tl.in_fault(e["s"], e["r"]))
                  and not _signed_out_order(e)]
    stale_503 = [e for e in events if e["st"] == 503
                 and not tl.in_fault(e["s"], e["r"], margin=UNAVAILABLE_GRACE)]
    counts = Counter(f"{e['k']} {e['st']}" for e in unexpected)
    ok = not unexpected and not stale_503
    summary = (f"{len(unexpected)} unexpected answers ({_top(counts)}), "
               f"{len(stale_503)} 503s more than {UNAVAILABLE_GRACE:.0f} s after every fault ended"
               if not ok else
               f"no 500 and no unexpected status in {len(events):,} answers; every 503 "
               f"within {UNAVAILABLE_GRACE:.0f} s of a fault")
    examples = [_ev(e, t0) for e in (unexpected + stale_503)[:5]]
    return Finding("no 500, no unexpected status", ok, summary, examples)


def _signed_out_order(e: dict[str, Any]) -> bool:
    """An order sent on a session that logout_everywhere ended meanwhile: no scope, 400."""
    return e["k"] == "order" and e["st"] == 400 and "idempotency_scope_missing" in e.get("body", "")


def check_answered(events: list[dict[str, Any]], t0: float) -> Finding:
    lost = [e for e in events if e["st"] == 0]
    ok = not lost
    summary = (f"{len(lost)} requests got no answer" if lost
               else f"all {len(events):,} requests answered")
    return Finding("no unanswered request", ok, summary, [_ev(e, t0) for e in lost[:5]])


def check_workers(servers: dict[str, Any]) -> Finding:
    start, end = servers["workers_start"], servers["workers_end"]
    served = set(servers["workers_served"])
    strangers = sorted(served - set(start))
    problems = servers.get("log_problems", [])
    ok = start == end and not strangers and not problems
    summary = (f"{len(start)} workers alive from start to end, none restarted" if ok else
               f"workers at start {start}, at end {end}, answering but not started first "
               f"{strangers}; {len(problems)} worker problems in the server log")
    return Finding("no worker death", ok, summary, problems[:5])


def check_hang_bound(events: list[dict[str, Any]], tl: Timeline, t0: float) -> Finding:
    slow = [e for e in events if (e.get("el") or 0) > config.HANG_BOUND]
    queued = [e for e in events if e["st"] and e["r"] - e["s"] > config.HANG_BOUND
              and (e.get("el") or 0) <= config.HANG_BOUND]
    worst = max((e.get("el") or 0 for e in events), default=0.0)
    by_route = Counter(f"{e['k']} in '{tl.phase_of(e['s'])}'" for e in slow)
    ok = not slow
    summary = (f"the slowest request spent {worst:.2f} s in Django (bound "
               f"{config.HANG_BOUND:.1f} s = 10 x the socket timeout)" if ok else
               f"{len(slow)} requests spent longer than {config.HANG_BOUND:.1f} s in Django "
               f"(max {worst:.2f} s): {_top(by_route)}")
    if queued:
        summary += (f"; {len(queued)} more waited over {config.HANG_BOUND:.0f} s in total "
                    "(queued behind busy threads)")
    slow.sort(key=lambda e: -(e.get("el") or 0))
    examples = [_ev(e, t0) for e in slow[:6]]
    return Finding("never a hang (time inside Django)", ok, summary, examples)


# --- rate limits ------------------------------------------------------------------------------

def check_rate_limits(events: list[dict[str, Any]], tl: Timeline, t0: float) -> Finding:
    """Per route and bucket: never more admitted than the algorithm allows (over any span
    the client bounds prove), and never a 429 unless enough hits could have counted."""
    problems: list[str] = []
    buckets = admitted = refused = 0
    for name, (_path, rate, algorithm, burst) in config.rate_routes().items():
        limit, period = config.parse_rate(rate)
        by_bucket: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e["k"] == name:
                by_bucket[e["b"]].append(e)
        for bucket, evs in by_bucket.items():
            buckets += 1
            allowed = sorted((e for e in evs if e["st"] == 200 and e.get("rem") is not None),
                             key=lambda e: e["s"])
            blocked = [e for e in evs if e["st"] == 429]
            admitted += len(allowed)
            refused += len(blocked)
            # Anything that may have been counted: admitted, failed open, or unanswered.
            counted = [(e["s"], e["r"] if e["st"] == 200 and e.get("rem") is not None
                        else tl.landing(e["s"], e["r"])) for e in evs if e["st"] != 429]
            problems += _over_admission(name, bucket, allowed, algorithm, limit, period, burst,
                                        tl, t0)
            window = period if algorithm != "token_bucket" else period / limit * (burst or limit)
            need = limit if algorithm != "token_bucket" else (burst or limit)
            for e in blocked:
                could = sum(1 for s, r in counted if s < e["r"] and r > e["s"] - window)
                if could < need:
                    problems.append(f"{name} bucket {bucket}: 429 at {fmt_t(e['s'], t0)} with "
                                    f"only {could} hits that could have counted (needs {need})")
    ok = not problems
    summary = (f"{buckets} buckets on 4 routes: {admitted:,} admitted with headers, "
               f"{refused:,} refused, all within the limits and never refused early"
               if ok else f"{len(problems)} violations in {buckets} buckets")
    return Finding("rate limits exact across workers and faults", ok, summary, problems[:8])


def _over_admission(name: str, bucket: str, allowed: list[dict[str, Any]], algorithm: str,
                    limit: int, period: float, burst: int | None, tl: Timeline,
                    t0: float) -> list[str]:
    found: list[str] = []
    if algorithm == "fixed_window":
        # A bucket lives BUCKET_SECONDS < period: one window, unless Redis forgot it.
        segments = _lives_of_redis(allowed, tl.empty_restarts)
        for seg in segments:
            if len(seg) > limit:
                found.append(f"{name} bucket {bucket}: {len(seg)} admitted in one window "
                             f"(limit {limit}) from {fmt_t(seg[0]['s'], t0)}")
        return found
    if algorithm == "sliding_window":
        for i in range(len(allowed) - limit):
            group = allowed[i:i + limit + 1]
            last = max(e["r"] for e in group)
            if last - group[0]["s"] < period and not tl.restart_between(group[0]["s"], last):
                found.append(f"{name} bucket {bucket}: {limit + 1} admitted within "
                             f"{last - group[0]['s']:.2f} s < {period:.0f} s from "
                             f"{fmt_t(group[0]['s'], t0)}")
                break
        return found
    interval = period / limit
    tokens = burst or limit
    for i in range(len(allowed)):
        last_r = 0.0
        for j in range(i, len(allowed)):
            last_r = max(last_r, allowed[j]["r"])
            span = last_r - allowed[i]["s"]
            n = j - i + 1
            if n > tokens + span / interval + 1 and not tl.restart_between(allowed[i]["s"], last_r):
                found.append(f"{name} bucket {bucket}: {n} admitted within {span:.2f} s "
                             f"(at most {tokens} + {span / interval:.1f})")
                return found
    return found


def _lives_of_redis(events: list[dict[str, Any]],
                    empty_restarts: Sequence[tuple[float, float]]) -> list[list[dict[str, Any]]]:
    """The events that provably reached each life of Redis's data, split at the restarts
    without persistence: before a kill, or after the restart was complete. A request in
    flight across a restart (sent before it was complete, answered after the kill) may have
    landed on either side: it is left out of both, so no ordering can make a violation."""
    restarts = sorted(empty_restarts)
    segments: list[list[dict[str, Any]]] = [[] for _ in range(len(restarts) + 1)]
    for e in events:
        if any(e["s"] <= done and e["r"] >= kill for kill, done in restarts):
            continue
        segments[bisect.bisect([done for _kill, done in restarts], e["s"])].append(e)
    return segments


# --- idempotency ------------------------------------------------------------------------------

def check_idempotency(events: list[dict[str, Any]], runlog: list[dict[str, Any]], tl: Timeline,
                      t0: float, t_end: float) -> list[Finding]:
    runs: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in runlog:
        if rec["kind"] == "order":
            runs[(rec["user"], rec["key"])].append(rec)
    orders = [e for e in events if e["k"] == "order"]

    # At most once, except where the docs say so.
    extra = documented = 0
    dupes: list[str] = []
    for (user, key), recs in runs.items():
        recs.sort(key=lambda r: r["t"])
        for a, b in itertools.pairwise(recs):
            if tl.restart_between(a["t"], b["t"]):
                documented += 1  # the record was lost with the data
            elif tl.in_fault(a["t"] - 1.0, a["t"] + 1.0):
                documented += 1  # Redis failed around the view: its answer was not stored
            else:
                extra += 1
                dupes.append(f"key {key} (user {user}) ran at {fmt_t(a['t'], t0)} and again "
                             f"at {fmt_t(b['t'], t0)} (workers {a['pid']}, {b['pid']})")
    keys = len(runs)
    ran = sum(len(r) for r in runs.values())
    once = Finding(
        "idempotency: at most once", extra == 0,
        f"{keys:,} keys ran {ran:,} times: {documented} documented re-runs (records lost "
        f"with a restart without persistence, or Redis lost right after the view), "
        f"{extra} undocumented", dupes[:6])

    # Replays are byte-identical to the stored answer.
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in orders:
        if e["st"] == 201:
            by_run[e["run"]].append(e)
    known = {r["run"] for recs in runs.values() for r in recs}
    mismatched: list[str] = []
    replays = 0
    for run, answers in by_run.items():
        replays += sum(1 for e in answers if e.get("rep"))
        shapes = {(e["body"], e.get("loc"), e.get("ct")) for e in answers}
        if len(shapes) > 1:
            mismatched.append(f"run {run[:8]}: {len(shapes)} different answers")
        if run not in known:
            mismatched.append(f"run {run[:8]} answered but never ran")
    replay = Finding(
        "idempotency: replays byte-identical", not mismatched,
        f"{replays:,} replays across {len(by_run):,} stored answers, each identical to the "
        f"first (status, body, Location, Content-Type)" if not mismatched
        else f"{len(mismatched)} stored answers replayed differently", mismatched[:6])

    # No key stuck at 409 beyond the claim's lease; every key settles.
    stuck: list[str] = []
    longest = 0.0
    per_device: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in orders:
        per_device[(e["p"], e["d"], e["key"])].append(e)
    bound = config.IDEMPOTENCY_LEASE + 2.0
    unsettled = 0
    for (_p, _d, key), evs in per_device.items():
        evs.sort(key=lambda e: e["s"])
        first_409 = next((e for e in evs if e["st"] == 409), None)
        if first_409 is None:
            continue
        after = [e for e in evs if e["s"] > first_409["s"] and e["st"] not in (409, 0, 503)]
        settled_at = after[0]["r"] if after else None
        last_409 = max(e["r"] for e in evs if e["st"] == 409)
        held = (settled_at or last_409) - first_409["s"]
        longest = max(longest, held)
        if settled_at is None:
            unsettled += 1
            if t_end - first_409["s"] > bound + 3:
                stuck.append(f"key {key}: 409 from {fmt_t(first_409['s'], t0)} to the end")
        elif held > bound:
            stuck.append(f"key {key}: 409 for {held:.1f} s from {fmt_t(first_409['s'], t0)}")
    conflicts = sum(1 for e in orders if e["st"] == 409)
    not_stuck = Finding(
        "idempotency: no key stuck at 409", not stuck,
        f"{conflicts:,} 409 answers; the longest a key answered 409 was {longest:.1f} s "
        f"(lease {config.IDEMPOTENCY_LEASE} s)" + (f"; {unsettled} keys still retrying at "
                                                   "the end, within the lease" if unsettled
                                                   else ""),
        stuck[:6])
    return [once, replay, not_stuck]


# --- sessions ---------------------------------------------------------------------------------

def revocation_grace() -> float:
    """Seconds after ``logout_everywhere`` returns during which another process may still
    serve the session: 0, or the session memory's bound when the app runs with it."""
    if "sessions" not in os.environ.get("SOAK_MEMORY", "").split(","):
        return 0.0
    from django_redispatterns.sessions.memory import SILENT_LIMIT

    return SILENT_LIMIT


def check_sessions(events: list[dict[str, Any]], tl: Timeline, t0: float) -> list[Finding]:
    grace = revocation_grace()
    born: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e["r"]):
        if e.get("set") and e["set"] != "-":
            born.setdefault(e["set"], e["r"])
    logouts = [e for e in events if e["k"] == "logout"]
    done = [e for e in logouts if e["st"] == 200]
    authed = [e for e in events if e.get("ck") and (
        (e["k"] == "me" and e["st"] == 200) or (e["k"] == "order" and e["st"] == 201))]
    by_user: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in authed:
        by_user[e["u"]].append(e)
    leaks: list[str] = []
    for lo in done:
        for e in by_user[lo["u"]]:
            if e["ck"] == lo["ck"] or e["s"] <= lo["r"] + grace:
                continue
            if born.get(e["ck"], float("inf")) >= lo["s"]:
                continue  # signed in after logout_everywhere started: may survive it
            leaks.append(f"user {lo['u']}: {e['k']} {e['st']} at {fmt_t(e['s'], t0)} on a "
                         f"session logout_everywhere ended at {fmt_t(lo['r'], t0)}")
    post = sum(1 for lo in done for e in events
               if e["u"] == lo["u"] and e["k"] == "me" and e["s"] > lo["r"]
               and e.get("ck") not in (None, lo["ck"])
               and born.get(e["ck"], float("inf")) < lo["s"])
    revoked = Finding(
        "logout_everywhere: no authenticated request after it returned"
        + (f" (+{grace:g} s: sessions in process memory)" if grace else ""), not leaks,
        f"{len(done)} calls returned; {post:,} later requests on ended sessions, "
        f"{len(leaks)} of them authenticated", leaks[:6])

    # A session ends only by a logout or a restart that lost the data.
    spurious: list[str] = []
    for e in events:
        if e["k"] != "me" or e["st"] != 401 or not e.get("ck"):
            continue
        b = born.get(e["ck"])
        if b is None:
            continue
        cause = any(lo["u"] == e["u"] and lo["s"] < e["r"] and lo["r"] >= b - 0.001
                    and lo.get("ck") != e["ck"] for lo in logouts)
        if not cause and not tl.restart_between(b, e["r"]):
            spurious.append(f"user {e['u']}: signed out at {fmt_t(e['s'], t0)} (session from "
                            f"{fmt_t(b, t0)}) with no logout and no data loss")
    kept = Finding(
        "sessions survive hangs and AOF restarts", not spurious,
        "no session ended without a logout_everywhere or a restart without persistence"
        if not spurious else f"{len(spurious)} sessions ended without cause", spurious[:6])
    return [revoked, kept]


# --- cache ------------------------------------------------------------------------------------

def check_freshness(events: list[dict[str, Any]], tl: Timeline, t0: float) -> Finding:
    late: list[dict[str, Any]] = []
    worst = {"cached": 0.0, "cached_swr": 0.0}
    answers = 0
    for e in events:
        if e["k"] not in worst or "ca" not in e:
            continue
        answers += 1
        alias = "default" if e["k"] == "cached" else "swr"
        age = e["s"] - e["ca"]  # at least this old when it was served
        worst[e["k"]] = max(worst[e["k"]], age)
        if age > config.CACHE_TIMEOUT + config.STALE_TTL[alias] + FRESHNESS_SLACK:
            e["_age"] = age
            late.append(e)
    by = Counter(f"{e['k']} in '{tl.phase_of(e['s'])}'" for e in late)
    ok = not late
    summary = (f"{answers:,} answers; oldest value served {worst['cached']:.2f} s "
               f"(timeout {config.CACHE_TIMEOUT} s, STALE_TTL 0) and {worst['cached_swr']:.2f} s"
               f" (STALE_TTL {config.STALE_TTL['swr']} s)")
    if late:
        summary = f"{len(late)} values served past timeout + STALE_TTL ({_top(by)}); " + summary
    late.sort(key=lambda e: -e["_age"])
    examples = [f"{e['k']}/{e['n']} served at {fmt_t(e['s'], t0)} {e['_age']:.2f} s after it "
                f"was computed" for e in late[:6]]
    return Finding("cache: no value served past its timeout (unless STALE_TTL)", ok, summary,
                   examples)


def check_single_flight(runlog: list[dict[str, Any]], tl: Timeline, t0: float) -> Finding:
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in runlog:
        if rec["kind"] == "compute":
            by_key[(rec["alias"], rec["key"])].append(rec)
    overlaps: list[str] = []
    excused = computes = 0
    for (alias, key), recs in by_key.items():
        recs.sort(key=lambda r: r["start"])
        computes += len(recs)
        running_end = -1.0
        for r in recs:
            if r["start"] < running_end:
                if tl.in_fault(r["start"], r["end"]):
                    excused += 1  # degraded: every caller computes while Redis is away
                else:
                    overlaps.append(f"{alias} {key}: a second computation at "
                                    f"{fmt_t(r['start'], t0)} while another ran")
            running_end = max(running_end, r["end"])
    ok = not overlaps
    summary = (f"{computes:,} computations of {len(by_key)} keys; {len(overlaps)} concurrent "
               f"with another of the same key while Redis was up, {excused} during faults "
               "(degraded, as documented)")
    return Finding("cache: single flight", ok, summary, overlaps[:6])


def check_ttls(servers: dict[str, Any]) -> Finding:
    audit = servers["ttl_audit"]
    ok = audit["no_ttl"] == 0
    summary = (f"{audit['keys']:,} keys at the end, {audit['no_ttl']} without a TTL "
               f"({', '.join(f'{k}: {v}' for k, v in sorted(audit['by_prefix'].items()))})")
    return Finding("every key has a TTL", ok, summary, audit["examples"][:6])


# --- helpers ----------------------------------------------------------------------------------

def _top(counter: Counter[str], n: int = 4) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counter.most_common(n)) or "none"


def _ev(e: dict[str, Any], t0: float) -> str:
    took = f"{e['r'] - e['s']:.2f} s"
    inside = f", {e['el']:.2f} s in Django" if e.get("el") is not None else ""
    err = f" ({e['err']})" if e.get("err") else ""
    body = f" {e['body'][:120]}" if e.get("body") and e["st"] not in (201,) else ""
    return f"{e['k']} -> {e['st']} at {fmt_t(e['s'], t0)}, {took}{inside}{err}{body}"
