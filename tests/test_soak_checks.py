"""The soak's checks (soak/checks.py) catch each broken promise they exist for.

Synthetic answers and run logs, no servers: each test builds a history that breaks one
promise (and a twin that keeps it) and asserts the check tells them apart. The soak itself
(``./dev soak``) runs in CI; these keep its checks from silently going vacuous.
"""

from __future__ import annotations

from typing import Any

import pytest

from soak import checks, config

T0 = 1_000.0


def timeline(*faults: tuple[float, float], restarts: tuple[tuple[float, float], ...] = ()
             ) -> checks.Timeline:
    phases: list[dict[str, Any]] = [{"name": "steady", "start": T0, "end": T0 + 100,
                                     "fault": False, "action": None}]
    for a, b in faults:
        phases.append({"name": "fault", "start": T0 + a, "end": T0 + b, "fault": True,
                       "action": "hang"})
    return checks.Timeline(phases, [(T0 + a, T0 + b) for a, b in restarts])


def ev(kind: str, s: float, r: float, st: int, **extra: Any) -> dict[str, Any]:
    return {"k": kind, "s": T0 + s, "r": T0 + r, "st": st, "p": 0, "d": 0, "u": 0, **extra}


def test_sliding_window_over_admission_is_caught():
    limit, _ = config.parse_rate(config.RATE_ROUTES["rl_sliding"][1])
    within = [ev("rl_sliding", 0.01 * i, 0.01 * i + 0.005, 200, b="x", rem=0)
              for i in range(limit + 1)]
    spread = [ev("rl_sliding", 0.3 * i, 0.3 * i + 0.005, 200, b="x", rem=0)
              for i in range(limit + 1)]
    assert not checks.check_rate_limits(within, timeline(), T0).ok
    assert checks.check_rate_limits(spread, timeline(), T0).ok


def test_a_429_with_too_few_hits_counted_is_caught():
    limit, _ = config.parse_rate(config.RATE_ROUTES["rl_fixed"][1])
    hits = [ev("rl_fixed", 0.01 * i, 0.01 * i + 0.005, 200, b="x", rem=limit - 1 - i)
            for i in range(limit - 1)]
    early = [*hits, ev("rl_fixed", 1.0, 1.01, 429, b="x")]
    full = [*hits, ev("rl_fixed", 0.9, 0.95, 200, b="x", rem=0), ev("rl_fixed", 1.0, 1.01, 429,
                                                                     b="x")]
    assert not checks.check_rate_limits(early, timeline(), T0).ok
    assert checks.check_rate_limits(full, timeline(), T0).ok


def test_fixed_window_counts_restart_in_flight_requests_on_neither_side_but_catches_excess():
    # Redis killed at t=5 and restarted empty, complete at t=6. Requests sent while it was
    # coming back and answered with headers landed on the new, empty counter: they do not
    # make the old window over-full (as they did when the split was at the restart's end).
    limit, _ = config.parse_rate(config.RATE_ROUTES["api_rule"][1])
    before = [ev("api_rule", 0.01 * i, 0.01 * i + 0.005, 200, b="x", rem=limit - 1 - i)
              for i in range(limit)]
    in_flight = [ev("api_rule", 5.5, 6.2, 200, b="x", rem=limit - 1),
                 ev("api_rule", 5.6, 6.3, 200, b="x", rem=limit - 2)]
    restarted = timeline((5.0, 6.0), restarts=((5.0, 6.0),))
    assert checks.check_rate_limits([*before, *in_flight], restarted, T0).ok
    # One admission too many before the kill is still a violation.
    extra = ev("api_rule", 4.0, 4.01, 200, b="x", rem=0)
    assert not checks.check_rate_limits([*before, extra, *in_flight], restarted, T0).ok
    # And so are too many after the restart was complete.
    after = [ev("api_rule", 7 + 0.01 * i, 7.005 + 0.01 * i, 200, b="x", rem=0)
             for i in range(limit + 1)]
    assert not checks.check_rate_limits([*before, *after], restarted, T0).ok


def test_a_decision_sent_to_a_hung_redis_counts_when_it_wakes():
    # Failed open during a hang, counted at wake: a 429 right after is explained.
    limit, _ = config.parse_rate(config.RATE_ROUTES["rl_sliding"][1])
    opened = [ev("rl_sliding", 5.0 + 0.01 * i, 5.5 + 0.01 * i, 200, b="x", rem=None)
              for i in range(limit)]
    after = [*opened, ev("rl_sliding", 10.2, 10.21, 429, b="x")]
    assert checks.check_rate_limits(after, timeline((5.0, 10.0)), T0).ok
    assert not checks.check_rate_limits(after, timeline(), T0).ok


def order_run(key: str, t: float, run: str) -> dict[str, Any]:
    return {"kind": "order", "key": key, "user": 1, "run": run, "t": T0 + t, "pid": 7}


def test_a_second_run_of_a_key_is_caught_unless_a_restart_lost_the_record():
    runs = [order_run("u0-1", 1.0, "a"), order_run("u0-1", 20.0, "b")]
    once = checks.check_idempotency([], runs, timeline(), T0, T0 + 100)[0]
    lost = checks.check_idempotency([], runs, timeline(restarts=((10.0, 11.0),)), T0,
                                    T0 + 100)[0]
    assert not once.ok
    assert lost.ok


def test_a_replay_that_differs_from_the_stored_answer_is_caught():
    first = ev("order", 1, 1.1, 201, key="k", run="a", body='{"order": "a"}', loc="/orders/a",
               ct="application/json", rep=False)
    same = {**first, "s": T0 + 2, "r": T0 + 2.1, "rep": True}
    other = {**same, "body": '{"order": "a", "x": 1}'}
    runs = [order_run("k", 1.05, "a")]
    assert checks.check_idempotency([first, same], runs, timeline(), T0, T0 + 9)[1].ok
    assert not checks.check_idempotency([first, other], runs, timeline(), T0, T0 + 9)[1].ok


def test_a_key_answering_409_past_the_lease_is_caught():
    lease = config.IDEMPOTENCY_LEASE
    short = [ev("order", 1, 1.01, 409, key="k"), ev("order", 2, 2.01, 201, key="k", run="a",
                                                     body="{}", rep=False)]
    stuck = [ev("order", 1, 1.01, 409, key="k"), ev("order", lease + 5, lease + 5.01, 409,
                                                     key="k")]
    assert checks.check_idempotency(short, [], timeline(), T0, T0 + 100)[2].ok
    assert not checks.check_idempotency(stuck, [], timeline(), T0, T0 + 100)[2].ok


def test_an_authenticated_request_after_logout_everywhere_returned_is_caught():
    signin = ev("signin", 0, 0.1, 200, set="old", ck="old")
    mine = ev("signin", 0, 0.1, 200, set="mine", ck="mine", d=1)
    logout = ev("logout", 1.0, 1.2, 200, ck="mine", d=1)
    leak = ev("me", 1.5, 1.6, 200, ck="old", auth=1)
    signed_out = ev("me", 1.5, 1.6, 401, ck="old")
    assert not checks.check_sessions([signin, mine, logout, leak], timeline(), T0)[0].ok
    assert checks.check_sessions([signin, mine, logout, signed_out], timeline(), T0)[0].ok


def test_a_value_served_past_its_timeout_is_caught_but_stale_ttl_allows_it():
    age = config.CACHE_TIMEOUT + 1.0
    late = ev("cached", 10, 10.1, 200, ca=T0 + 10 - age, n=0)
    stale = ev("cached_swr", 10, 10.1, 200, ca=T0 + 10 - age, n=0)
    assert not checks.check_freshness([late], timeline(), T0).ok
    assert checks.check_freshness([stale], timeline(), T0).ok


def test_two_computations_of_one_key_at_once_are_caught_outside_faults():
    runs = [{"kind": "compute", "alias": "default", "key": "item:0", "start": T0 + 1,
             "end": T0 + 1.1, "run": "a", "pid": 1},
            {"kind": "compute", "alias": "default", "key": "item:0", "start": T0 + 1.05,
             "end": T0 + 1.15, "run": "b", "pid": 2}]
    assert not checks.check_single_flight(runs, timeline(), T0).ok
    assert checks.check_single_flight(runs, timeline((0.5, 2.0)), T0).ok


def test_a_hang_500_and_unanswered_request_are_caught():
    slow = ev("cached", 1, 9, 200, el=config.HANG_BOUND + 1)
    assert not checks.check_hang_bound([slow], timeline(), T0).ok
    assert not checks.check_statuses([ev("me", 1, 1.1, 500)], timeline(), T0).ok
    assert checks.check_statuses([ev("me", 1, 1.1, 503)], timeline((0.5, 2.0)), T0).ok
    assert not checks.check_statuses([ev("me", 10, 10.1, 503)], timeline((0.5, 2.0)), T0).ok
    assert not checks.check_answered([ev("me", 1, 31, 0, err="timed out")], T0).ok


def test_with_sessions_in_memory_only_a_request_past_the_bound_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django_redispatterns.sessions.memory import SILENT_LIMIT

    monkeypatch.setenv("SOAK_MEMORY", "sessions")
    signin = ev("signin", 0, 0.1, 200, set="old", ck="old")
    mine = ev("signin", 0, 0.1, 200, set="mine", ck="mine", d=1)
    logout = ev("logout", 1.0, 1.2, 200, ck="mine", d=1)
    within = ev("me", 1.2 + SILENT_LIMIT / 2, 1.3 + SILENT_LIMIT, 200, ck="old", auth=1)
    past = ev("me", 1.3 + SILENT_LIMIT, 1.4 + SILENT_LIMIT, 200, ck="old", auth=1)
    assert checks.check_sessions([signin, mine, logout, within], timeline(), T0)[0].ok
    assert not checks.check_sessions([signin, mine, logout, past], timeline(), T0)[0].ok
