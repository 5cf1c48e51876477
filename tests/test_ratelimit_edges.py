"""Rate limiting at the edges: undecided rules, the operator command's keys, header
consistency, proxy chains, large costs."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.ratelimit import RateLimiter, ratelimit
from django_redispatterns.ratelimit.identity import client_ip
from tests.redis_servers import KEY_PREFIX, RedisServer

# Every key written here must expire: checked after each test by conftest's autouse fixture.
pytestmark = pytest.mark.urls("tests.urls_ratelimit")

MIDDLEWARE = "django_redispatterns.middleware.RateLimitMiddleware"
ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket"]


def patterns(**ratelimit: Any) -> dict[str, Any]:
    return {"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX, "SOCKET_TIMEOUT": 0.5,
            "SOCKET_CONNECT_TIMEOUT": 0.5, "RATELIMIT": ratelimit}


def settings_for(*, middleware: bool = False, **ratelimit: Any) -> Any:
    from django.conf import settings

    extra = [MIDDLEWARE] if middleware else []
    return override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, *extra],
                             REDIS_PATTERNS=patterns(**ratelimit))


def drf_rates(rate: str = "5/min") -> Any:
    return override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"tests": rate}})


@pytest.fixture
def dead_url(redis_server_factory: Callable[..., RedisServer]) -> str:
    server = redis_server_factory()
    server.kill()
    return server.url


def sync_get(path: str) -> Any:
    return Client().get(path, HTTP_ACCEPT="application/json")


def async_get(path: str) -> Any:
    async def run() -> Any:
        return await AsyncClient().get(path, HTTP_ACCEPT="application/json")

    return asyncio.run(run())


# Every entry point a rule can run through: (name, path, uses the middleware, getter).
ENTRY_POINTS = [
    ("decorator", "/reads/", False, sync_get),
    ("async decorator", "/async-reads/", False, async_get),
    ("middleware", "/api/reads/", True, sync_get),
    ("async middleware", "/api/async-reads/", True, async_get),
    ("DRF throttle", "/drf-reads/", False, sync_get),
]
API_RULE = {"path": r"^/api/", "rate": "5/m", "name": "api"}


def run_entry_point(path: str, middleware: bool, get: Callable[[str], Any], url: str,
                    fail_open: bool) -> Any:
    from rest_framework.settings import api_settings

    with (settings_for(middleware=middleware, CONNECTION=url, FAIL_OPEN=fail_open,
                       RULES=[API_RULE]),
          drf_rates()):
        api_settings.reload()
        try:
            return get(path)
        finally:
            api_settings.reload()


# --- a rule Redis could not decide ---------------------------------------------------------


@pytest.mark.parametrize(("entry", "path", "middleware", "get"), ENTRY_POINTS,
                         ids=[e[0] for e in ENTRY_POINTS])
def test_fail_open_leaves_an_undecided_decision_the_view_can_read(
        dead_url: str, entry: str, path: str, middleware: bool,
        get: Callable[[str], Any]) -> None:
    """Redis down, FAIL_OPEN: the view reads request.ratelimit and request.limited (both
    exist), the Decision says it was not decided and invents no count, and no header
    claims one."""
    response = run_entry_point(path, middleware, get, dead_url, fail_open=True)
    assert response.status_code == 200, response.content  # was a 500 AttributeError
    assert response.json() == {"limited": False, "allowed": True, "decided": False,
                               "remaining": None}
    for header in ("RateLimit", "RateLimit-Remaining", "RateLimit-Limit", "RateLimit-Reset",
                   "Retry-After"):
        assert header not in response, header


@pytest.mark.parametrize(("entry", "path", "middleware", "get"), ENTRY_POINTS,
                         ids=[e[0] for e in ENTRY_POINTS])
def test_fail_closed_answers_503_on_every_entry_point(
        dead_url: str, entry: str, path: str, middleware: bool,
        get: Callable[[str], Any]) -> None:
    response = run_entry_point(path, middleware, get, dead_url, fail_open=False)
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "1"
    assert "RateLimit" not in response


def test_undecided_decision_is_allowed_without_counts(dead_url: str) -> None:
    from django_redispatterns.ratelimit import Decision

    decision = Decision.undecided(RateLimiter("5/m", algorithm="token_bucket", burst=3))
    assert decision.allowed and not decision.decided and bool(decision)
    assert decision.remaining is None and decision.reset_after is None
    assert decision.limit == 3 and decision.retry_after == 0.0


def test_a_decided_rule_keeps_its_headers_next_to_an_undecided_one(
        dead_url: str, client: Client) -> None:
    """The middleware's rule on a live Redis, the view's decorator on a dead one: the
    headers describe the decided rule only; the policy list names both."""
    stacked = ratelimit("5/m", name="view")(lambda request: _ok(request))
    request = RequestFactory().get("/x/", REMOTE_ADDR="192.0.2.50")
    with settings_for(RULES=[API_RULE]):
        live = RateLimiter("5/m", group="live")
        from django_redispatterns.ratelimit.engine import Rule, check

        rule = Rule.build(rate="5/m", group="live", name="site")
        assert check(request, (rule,)) is None
    with settings_for(CONNECTION=dead_url):
        response = stacked(request)
    assert response.status_code == 200
    assert request.ratelimit.decided  # the binding decision is the decided one
    assert response["RateLimit"].startswith('"site";')
    assert '"view"' not in response["RateLimit"]
    assert '"view";q=5;w=60' in response["RateLimit-Policy"]
    live.reset(f"ip:{client_ip(request)}")


def _ok(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse("ok")


# --- the operator command addresses the decorator's own key ------------------------------


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimit", *args, stdout=out)
    return out.getvalue()


def test_command_view_uses_the_decorators_group(client: Client) -> None:
    """/grouped/ is ``@ratelimit("2/m", group="shared")``: inspecting it by its view name
    finds the blocked client (it answered "remaining 5" from a key nobody uses)."""
    for _ in range(3):
        client.get("/grouped/", REMOTE_ADDR="203.0.113.77")
    out = command("inspect", "--view", "tests.urls_ratelimit.grouped",
                  "--identity", "203.0.113.77")
    assert "remaining  0" in out and "BLOCKED" in out
    assert "reset" in command("reset", "--view", "tests.urls_ratelimit.grouped",
                              "--identity", "203.0.113.77")
    assert client.get("/grouped/", REMOTE_ADDR="203.0.113.77").status_code == 200


@pytest.mark.parametrize(("view", "message"), [
    ("tests.urls_ratelimit.no_such_view", "cannot be imported"),
    ("tests.urls_ratelimit.plain", "not decorated with @ratelimit"),
    ("nosuchmodule.view", "cannot be imported"),
])
def test_command_refuses_views_that_do_not_exist_or_are_not_limited(
        view: str, message: str) -> None:
    for action in ("inspect", "reset"):
        with pytest.raises(CommandError, match=message):
            command(action, "--view", view, "--identity", "203.0.113.77")


def test_command_refuses_a_rate_or_algorithm_the_view_does_not_use() -> None:
    with pytest.raises(CommandError, match="'3/m'"):
        command("inspect", "--view", "tests.urls_ratelimit.fixed", "--rate", "3/m",
                "--identity", "203.0.113.77")
    with pytest.raises(CommandError, match="token_bucket"):
        command("inspect", "--view", "tests.urls_ratelimit.fixed",
                "--algorithm", "token_bucket", "--identity", "203.0.113.77")


def test_command_stacked_view_reports_every_rule(client: Client) -> None:
    for _ in range(3):
        client.get("/stacked/", REMOTE_ADDR="203.0.113.78")
    out = command("inspect", "--view", "tests.urls_ratelimit.stacked",
                  "--identity", "203.0.113.78")
    assert out.count("key        ") == 2
    assert "remaining  0" in out and "remaining  2" in out  # sustained 2/m, burst 5/m
    # one of them, by its rate
    assert command("inspect", "--view", "tests.urls_ratelimit.stacked", "--rate", "5/m",
                   "--identity", "203.0.113.78").count("key        ") == 1
    command("reset", "--view", "tests.urls_ratelimit.stacked", "--identity", "203.0.113.78")
    assert client.get("/stacked/", REMOTE_ADDR="203.0.113.78").status_code == 200


def test_command_class_based_view_methods(client: Client) -> None:
    for _ in range(3):
        client.get("/class/", REMOTE_ADDR="203.0.113.79")
    out = command("inspect", "--view", "tests.urls_ratelimit.ClassView",
                  "--identity", "203.0.113.79")
    assert "BLOCKED" in out  # GET's 2/m rule; POST's 1/m rule untouched
    assert "remaining  1" in out


def test_command_help_explains_actions_algorithm_and_burst() -> None:
    from django.core.management import load_command_class

    cmd = load_command_class("django_redispatterns", "ratelimit")
    text = cmd.create_parser("manage.py", "ratelimit").format_help()
    assert "inspect" in text and "reset" in text
    assert re.search(r"inspect: .*counting.*reset: delete", text, re.S), text
    assert re.search(r"--algorithm \{fixed_window,sliding_window,token_bucket\}", text)
    assert re.search(r"--burst BURST\s+.*token_bucket", text, re.S), text


# --- Retry-After and the reset in RateLimit agree, for every algorithm ---------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_retry_after_is_never_earlier_than_the_reset_it_sits_next_to(algorithm: str) -> None:
    """A blocked client told "retry in 2 s" must not be told "nothing comes back for
    10 s" in the same response (the token bucket did: Retry-After 2, t=10)."""
    view = ratelimit("5/10s", algorithm=algorithm, group=f"consistent-{algorithm}")(_ok)
    request_factory = RequestFactory()
    with settings_for(LEGACY_HEADERS=True):
        responses = [view(request_factory.get("/", REMOTE_ADDR="192.0.2.60"))
                     for _ in range(6)]
    blocked = responses[-1]
    assert blocked.status_code == 429
    retry = int(blocked["Retry-After"])
    window = int(re.search(r";t=(\d+)", blocked["RateLimit"]).group(1))  # type: ignore
    assert retry >= window >= 1
    assert retry >= int(blocked["RateLimit-Reset"])
    # and the promise holds: the next unit of quota is back after Retry-After
    for response in responses[:-1]:
        assert int(re.search(r";t=(\d+)", response["RateLimit"]).group(1)) <= 10  # type: ignore
    RateLimiter("5/10s", algorithm=algorithm, group=f"consistent-{algorithm}").reset(
        "ip:192.0.2.60")


def test_token_bucket_reset_is_when_the_next_token_arrives() -> None:
    limiter = RateLimiter("5/10s", algorithm="token_bucket", group="gcra-reset")
    for _ in range(5):
        decision = limiter.hit("c")
    assert decision.remaining == 0
    assert 1.5 < decision.reset_after <= 2.0  # one token every 2 s, not the full 10 s
    blocked = limiter.hit("c")
    assert not blocked.allowed and blocked.retry_after >= blocked.reset_after - 0.01
    limiter.reset("c")


# --- X-Forwarded-For entries that are no address end the walk ------------------------------


def ip_of(trusted: list[str], remote: str, forwarded: str) -> str:
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    with settings_for(TRUSTED_PROXIES=trusted):
        return client_ip(request)


@pytest.mark.parametrize("junk", ["unknown", "", "_hidden", "not-an-ip", "1.2.3"])
def test_an_entry_that_is_no_address_ends_the_walk(junk: str) -> None:
    """A proxy appending "unknown" must not let the forged entries to its left become the
    identity: the walk stops there and the proxy that wrote it is the identity."""
    forwarded = f"6.6.6.{{n}}, {junk}, 10.0.0.7"
    identities = {ip_of(["10.0.0.0/8"], "10.0.0.1", forwarded.format(n=n)) for n in range(5)}
    assert identities == {"10.0.0.7"}


def test_forged_entries_behind_unknown_cannot_dodge_the_limit(client: Client) -> None:
    with settings_for(TRUSTED_PROXIES=["10.0.0.0/8"]):
        codes = [client.get("/grouped/", REMOTE_ADDR="10.0.0.1",
                            HTTP_X_FORWARDED_FOR=f"6.6.6.{n}, unknown, 10.0.0.8").status_code
                 for n in range(5)]
    assert codes == [200, 200, 429, 429, 429]  # 2/m: 5 of 5 were admitted before
    RateLimiter("2/m", group="shared").reset("ip:10.0.0.8")


def test_walk_still_skips_trusted_hops_and_stops_at_the_first_untrusted() -> None:
    assert ip_of(["10.0.0.0/8"], "10.0.0.1", "6.6.6.6, 203.0.113.9, 10.0.0.2") == "203.0.113.9"
    assert ip_of(["10.0.0.0/8"], "10.0.0.1", "10.0.0.3, 10.0.0.2") == "10.0.0.3"
    assert ip_of(["10.0.0.0/8"], "10.0.0.1", "unknown") == "10.0.0.1"


# --- large costs ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_any_cost_the_rate_allows_gets_a_decision(algorithm: str) -> None:
    """cost >= ~4000 overflowed Lua's unpack() in the sliding window: a 500, not a
    decision."""
    limiter = RateLimiter("20000/h", algorithm=algorithm, group="bigcost")
    first = limiter.hit("c", 5000)
    assert first.allowed and first.remaining == 15000
    assert limiter.hit("c", 15000).allowed
    assert not limiter.hit("c", 1).allowed
    assert limiter.peek("c").remaining == 0
    limiter.reset("c")


def test_sliding_window_big_cost_resent_counts_once() -> None:
    limiter = RateLimiter("20000/h", algorithm="sliding_window", group="bigcost-resend")
    assert limiter.hit("c", 9000, request_id="r1").allowed
    assert limiter.hit("c", 9000, request_id="r1").allowed
    assert limiter.peek("c").remaining == 11000
    limiter.reset("c")


def test_a_middleware_rule_takes_a_cost(client: Client) -> None:
    with settings_for(middleware=True, RULES=[{**API_RULE, "cost": 2}]):
        codes = [client.get("/api/plain/", REMOTE_ADDR="192.0.2.61").status_code
                 for _ in range(3)]
    assert codes == [200, 200, 429]  # 5/m at 2 a request


@pytest.mark.parametrize("cost", [0, -1, 6, 1.5, True, "2"])
def test_a_rule_whose_cost_the_rate_cannot_allow_is_refused_when_built(cost: Any) -> None:
    with pytest.raises(ConfigurationError, match="cost must be"):
        ratelimit("5/m", cost=cost)
    with (override_settings(REDIS_PATTERNS=patterns(RULES=[{"rate": "5/m", "cost": cost}])),
          pytest.raises(ConfigurationError, match="cost'] must be")):
        from django_redispatterns.middleware import RateLimitMiddleware

        RateLimitMiddleware(lambda request: None)


# --- the script's two answer forms ---------------------------------------------------------

# An admitted hit is answered with one integer (reset_ms * (capacity + 1) + remaining) when
# that product is exact in a Lua number, else with the string form: both must read alike.
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("rate", "limit", "window"), [
    ("1000/h", 1000, 3600.0),
    ("1000000000/d", 1_000_000_000, 86400.0),  # too large to pack: the string form
])
def test_admitted_answers_read_the_same_packed_or_not(algorithm: str, rate: str, limit: int,
                                                      window: float) -> None:
    limiter = RateLimiter(rate, algorithm=algorithm, group="answer-forms")
    limiter.reset("c")
    first = limiter.hit("c", 3)
    assert first.allowed and first.decided and first.retry_after == 0.0
    assert (first.limit, first.remaining) == (limit, limit - 3)
    if algorithm == "token_bucket":  # the next token arrives one interval later, at most
        assert 0 < first.reset_after <= window / limit * 3 + 0.001
    else:
        assert first.reset_after == window
    peeked = limiter.peek("c")  # a fast token bucket may have refilled since
    assert peeked.allowed and limit - 3 <= peeked.remaining <= limit
    assert 0 <= peeked.reset_after <= first.reset_after
    assert algorithm == "token_bucket" or peeked.remaining == limit - 3
    limiter.reset("c")
