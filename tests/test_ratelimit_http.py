"""Rate limiting over HTTP: decorator, middleware, headers, identities, DRF, command."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_redispatterns import connection
from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.middleware import RateLimitMiddleware
from django_redispatterns.ratelimit.identity import client_ip
from django_redispatterns.signals import ratelimit_blocked
from tests.compat import aforce_login

pytestmark = pytest.mark.urls("tests.urls_ratelimit")

MIDDLEWARE = "django_redispatterns.middleware.RateLimitMiddleware"
JSON_TYPE = "application/json"


@pytest.fixture(autouse=True)
def _every_key_expires(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """After every scenario: each rate-limit key this module wrote has a TTL (house rule)."""
    yield redis_client
    for key in redis_client.scan_iter(match="rptest:rl:*", count=1000):
        assert redis_client.pttl(key) != -1, key


def patterns(**ratelimit: Any) -> dict[str, Any]:
    return {"CONNECTION": "default", "KEY_PREFIX": "rptest", "RATELIMIT": ratelimit}


def with_middleware(*rules: dict[str, Any], **extra: Any) -> Any:
    from django.conf import settings

    return override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
        REDIS_PATTERNS=patterns(RULES=list(rules), **extra),
    )


# Structured-field shapes of the IETF draft headers.
POLICY_ITEM = r'"[^"]+";q=\d+(;qu="requests")?;w=\d+'
STATE_ITEM = r'"[^"]+";r=\d+;t=\d+;pk=:[A-Za-z0-9+/]+={0,2}:'
POLICY_RE = re.compile(rf"^{POLICY_ITEM}(, {POLICY_ITEM})*$")
STATE_RE = re.compile(rf"^{STATE_ITEM}(, {STATE_ITEM})*$")


def assert_headers(response: Any, limit: int, remaining: int) -> None:
    assert response["RateLimit-Limit"] == str(limit)
    assert response["RateLimit-Remaining"] == str(remaining)
    assert 0 <= int(response["RateLimit-Reset"]) <= 60
    assert POLICY_RE.match(response["RateLimit-Policy"]), response["RateLimit-Policy"]
    assert STATE_RE.match(response["RateLimit"]), response["RateLimit"]


# --- decorator ----------------------------------------------------------------------------


def test_decorator_blocks_with_429_retry_after_and_headers(client: Client) -> None:
    first = client.get("/fixed/", HTTP_ACCEPT=JSON_TYPE)
    assert first.status_code == 200
    assert_headers(first, 2, 1)
    assert first["RateLimit-Policy"] == '"default";q=2;w=60'
    assert first.json() == {"limited": False, "remaining": 1}
    assert client.get("/fixed/").status_code == 200
    blocked = client.get("/fixed/", HTTP_ACCEPT=JSON_TYPE)
    assert blocked.status_code == 429  # django-ratelimit answers 403 (#305, #89)
    assert_headers(blocked, 2, 0)
    retry = int(blocked["Retry-After"])  # whole seconds (django-ratelimit has none: #165)
    assert 1 <= retry <= 60
    assert retry >= int(re.search(r";t=(\d+)", blocked["RateLimit"]).group(1))  # type: ignore
    body = blocked.json()
    assert blocked["Content-Type"] == "application/json"
    assert body["status"] == 429 and body["retry_after"] == retry
    assert body["violated-policies"] == ["default"]
    assert body["type"].endswith("quota-exceeded")


def test_429_body_follows_accept(client: Client) -> None:
    for _ in range(2):
        client.get("/fixed/")
    assert client.get("/fixed/")["Content-Type"] == "application/problem+json"  # no Accept
    html = client.get("/fixed/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert html.status_code == 429 and html["Content-Type"].startswith("text/plain")
    problem = client.get("/fixed/", HTTP_ACCEPT="application/problem+json")
    assert problem["Content-Type"] == "application/problem+json"
    json.loads(problem.content)


def test_methods_filter_counts_only_listed_methods(client: Client) -> None:
    for _ in range(5):
        assert client.get("/login/").status_code == 200
    assert [client.post("/login/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert client.get("/login/").status_code == 200


def test_token_bucket_view_and_block_false(client: Client) -> None:
    assert [client.get("/bucket/").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/soft/").json() == {"limited": False, "remaining": 0}
    second = client.get("/soft/")
    assert second.status_code == 200  # block=False: the view decides
    assert second.json() == {"limited": True, "remaining": 0}


def test_stacked_decorators_report_every_policy(client: Client) -> None:
    responses = [client.get("/stacked/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0]["RateLimit-Policy"] == '"burst";q=5;w=60, "sustained";q=2;w=60'
    assert responses[1]["RateLimit-Limit"] == "2"  # the binding policy
    assert responses[1]["RateLimit-Remaining"] == "0"


def test_user_key_counts_per_user_and_skips_anonymous(client: Client, db: Any) -> None:
    for _ in range(4):
        assert client.get("/user/").status_code == 200  # anonymous: rule does not apply
    alice = get_user_model().objects.create_user("alice", password="x")
    bob = get_user_model().objects.create_user("bob", password="x")
    client.force_login(alice)
    assert [client.get("/user/").status_code for _ in range(3)] == [200, 200, 429]
    other = Client()
    other.force_login(bob)
    assert other.get("/user/").status_code == 200


def test_header_and_callable_keys(client: Client) -> None:
    codes = [client.get("/header/", HTTP_X_API_KEY="k1").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert client.get("/header/", HTTP_X_API_KEY="k2").status_code == 200
    assert [client.get("/callable/?tenant=a").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/callable/?tenant=b").status_code == 200


def test_block_is_logged_and_signalled(client: Client, caplog: Any) -> None:
    seen: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    ratelimit_blocked.connect(receiver)
    try:
        with caplog.at_level(logging.INFO, logger="django_redispatterns.ratelimit"):
            for _ in range(4):
                client.get("/fixed/", REMOTE_ADDR="198.51.100.23")
    finally:
        ratelimit_blocked.disconnect(receiver)
    assert len(seen) == 2
    assert seen[0]["decision"].allowed is False
    assert re.fullmatch(r"[0-9a-f]{32}", seen[0]["identity"])
    assert seen[0]["request"].path == "/fixed/"
    blocked_logs = [r for r in caplog.records if "blocked" in r.getMessage()]
    assert len(blocked_logs) == 2
    assert "198.51.100.23" not in caplog.text


@override_settings(REDIS_PATTERNS=patterns(VIEW="tests.urls_ratelimit.custom_429"))
def test_custom_429_view_keeps_the_headers(client: Client) -> None:
    for _ in range(2):
        client.get("/fixed/")
    blocked = client.get("/fixed/")
    assert blocked.status_code == 429 and blocked.json() == {"custom": True, "retry": True}
    assert int(blocked["Retry-After"]) >= 1
    assert blocked["RateLimit-Remaining"] == "0"


@override_settings(REDIS_PATTERNS=patterns(VIEW="tests.urls_ratelimit.async_custom_429"))
def test_async_custom_429_view_works_for_sync_and_async_views(client: Client) -> None:
    """courtlistener PR #7941: an async RATELIMIT_VIEW returned a coroutine -> 500."""
    for _ in range(2):
        client.get("/fixed/")
    blocked = client.get("/fixed/")
    assert blocked.status_code == 429 and blocked.content == b"slow down (async)"

    async def run() -> None:
        aclient = AsyncClient()
        for _ in range(2):
            await aclient.get("/async/")
        response = await aclient.get("/async/")
        assert response.status_code == 429 and response.content == b"slow down (async)"
        assert int(response["Retry-After"]) >= 1

    asyncio.run(run())


# --- async (ASGI) -------------------------------------------------------------------------


def test_async_view_uses_the_asyncio_client() -> None:
    async def run() -> tuple[list[int], dict[str, Any]]:
        aclient = AsyncClient()
        codes = [(await aclient.get("/async/")).status_code for _ in range(3)]
        return codes, dict(connection._async_clients.get(asyncio.get_running_loop(), {}))

    codes, per_loop = asyncio.run(run())
    assert codes == [200, 200, 429]
    assert per_loop, "the async path must use a redis.asyncio client for this loop"


def test_async_user_or_ip_resolves_the_user_without_sync_db_access(
        transactional_db: Any) -> None:
    """A logged-in user under ASGI: request.user must come from auser(), not a sync query
    in the event loop (which raises SynchronousOnlyOperation)."""
    user = get_user_model().objects.create_user("carol", password="x")

    async def run() -> list[int]:
        aclient = AsyncClient()
        await aforce_login(aclient, user)
        codes = [(await aclient.get("/async-user/")).status_code for _ in range(3)]
        anonymous = AsyncClient()  # same IP, other bucket: user vs ip identity
        codes.append((await anonymous.get("/async-user/")).status_code)
        return codes

    assert asyncio.run(run()) == [200, 200, 429, 200]


# --- identities ---------------------------------------------------------------------------


def ip_of(settings_patch: dict[str, Any], **meta: str) -> str:
    request = RequestFactory().get("/")
    request.META.update(meta)
    with override_settings(REDIS_PATTERNS=patterns(**settings_patch)):
        return client_ip(request)


def test_forged_x_forwarded_for_is_ignored_without_trusted_proxies() -> None:
    assert ip_of({}, REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="1.1.1.1") == "192.0.2.1"


def test_trusted_proxy_chain_uses_the_first_untrusted_hop() -> None:
    trusted = {"TRUSTED_PROXIES": ["10.0.0.0/8", "192.0.2.1"]}
    meta = {"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.9, 192.0.2.1"}
    assert ip_of(trusted, **meta) == "203.0.113.9"  # 6.6.6.6 is client-controlled
    # an untrusted peer's XFF is ignored even when proxies are configured
    assert ip_of(trusted, REMOTE_ADDR="198.51.100.2", HTTP_X_FORWARDED_FOR="1.1.1.1") == (
        "198.51.100.2")
    assert ip_of(trusted, REMOTE_ADDR="10.0.0.5") == "10.0.0.5"


def test_ipv6_is_grouped_by_prefix_and_ipv4_mapped_is_ipv4() -> None:
    a = ip_of({}, REMOTE_ADDR="2001:db8:1:2:aaaa::1")
    b = ip_of({}, REMOTE_ADDR="2001:db8:1:2:ffff::9")
    assert a == b == "2001:db8:1:2::/64"
    assert ip_of({"IPV6_PREFIX": 128}, REMOTE_ADDR="2001:db8::1") == "2001:db8::1"
    assert ip_of({}, REMOTE_ADDR="::ffff:192.0.2.7") == "192.0.2.7"


def test_ipv6_neighbours_share_a_bucket(client: Client) -> None:
    codes = [client.get("/fixed/", REMOTE_ADDR=f"2001:db8:0:1::{i}").status_code
             for i in range(1, 4)]
    assert codes == [200, 200, 429]


def test_empty_remote_addr_is_a_configuration_error() -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="")
    with pytest.raises(ConfigurationError, match="REMOTE_ADDR"):
        client_ip(request)


# --- middleware ---------------------------------------------------------------------------


def test_middleware_applies_every_matching_rule(client: Client) -> None:
    rules = ({"path": r"^/api/", "rate": "3/m", "name": "api"},
             {"path": r"^/api/", "rate": "2/m", "algorithm": "token_bucket", "name": "tight",
              "methods": ["GET"]},
             {"path": r"^/other/", "rate": "1/m"})
    with with_middleware(*rules):
        first = client.get("/api/plain/")
        assert first["RateLimit-Policy"] == '"api";q=3;w=60, "tight";q=2;w=60'
        assert first.json()["remaining"] == 1  # request.ratelimit = the binding decision
        assert client.get("/api/plain/").status_code == 200
        assert client.post("/api/plain/").status_code == 200  # "tight" is GET only
        blocked = client.post("/api/plain/", HTTP_ACCEPT=JSON_TYPE)
        assert blocked.status_code == 429
        assert blocked.json()["violated-policies"] == ["api"]
        both = client.get("/api/plain/", HTTP_ACCEPT=JSON_TYPE)
        assert both.json()["violated-policies"] == ["api", "tight"]
        assert both["RateLimit"].startswith('"api";r=0;t=')
        assert "RateLimit" not in client.get("/plain/")  # no rule matched


def test_middleware_and_decorator_headers_combine(client: Client) -> None:
    with with_middleware({"rate": "10/m", "name": "site"}):
        response = client.get("/fixed/")
        assert response["RateLimit-Policy"] == '"site";q=10;w=60, "default";q=2;w=60'
        assert response["RateLimit-Limit"] == "2"


def test_middleware_under_asgi() -> None:
    async def run() -> list[Any]:
        aclient = AsyncClient()
        return [await aclient.get("/async-plain/") for _ in range(3)]

    with with_middleware({"path": r"^/async-plain/", "rate": "2/m"}):
        responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0]["RateLimit-Remaining"] == "1"


def test_bad_rules_fail_at_startup_naming_the_value() -> None:
    with (override_settings(REDIS_PATTERNS=patterns(RULES=[{"rate": "ten/m"}])),
          pytest.raises(ConfigurationError, match="'ten/m'")):
        RateLimitMiddleware(lambda request: None)


# --- DRF ----------------------------------------------------------------------------------


def drf(rate: str = "10/min") -> Any:
    return override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"tests": rate}})


def test_drf_throttle_is_exact_under_100_concurrent_requests() -> None:
    """DRF's own cache throttle lets 29 of 100 through at 10/min (ANCHORS 2.1 row 3)."""
    with drf():
        from rest_framework.settings import api_settings

        api_settings.reload()

        def call(_: int) -> int:
            return Client().get("/drf/").status_code

        with ThreadPoolExecutor(20) as pool:
            codes = list(pool.map(call, range(100)))
        assert codes.count(200) == 10 and codes.count(429) == 90
        blocked = Client().get("/drf/")
        assert 1 <= int(blocked["Retry-After"]) <= 60
    api_settings.reload()


def test_drf_decisions_get_headers_from_the_middleware() -> None:
    from rest_framework.settings import api_settings

    with drf("3/min"), with_middleware():
        api_settings.reload()
        response = Client().get("/drf/")
        assert response.status_code == 200
        assert response["RateLimit-Policy"] == '"tests";q=3;w=60'
        assert response["RateLimit-Remaining"] == "2"
    api_settings.reload()


def test_decorator_on_class_based_view_methods(client: Client) -> None:
    assert [client.get("/class/").status_code for _ in range(3)] == [200, 200, 429]
    assert [client.post("/class/").status_code for _ in range(2)] == [200, 429]


def test_drf_rate_comes_from_default_throttle_rates() -> None:
    from rest_framework.settings import api_settings

    from django_redispatterns.contrib.drf import RedisRateThrottle

    class NoScope(RedisRateThrottle):
        scope = "missing"

    with drf("2/minute"):
        api_settings.reload()
        assert [Client().get("/drf/").status_code for _ in range(3)] == [200, 200, 429]
        with pytest.raises(Exception, match="'missing'"):
            NoScope()
    api_settings.reload()


# --- operator command ---------------------------------------------------------------------


def test_command_inspects_and_resets_one_client(client: Client) -> None:
    rule = {"path": r"^/api/", "rate": "2/m", "name": "api", "key": "ip"}
    with with_middleware(rule):
        for _ in range(3):
            client.get("/api/plain/", REMOTE_ADDR="203.0.113.5")
        out = io.StringIO()
        call_command("ratelimit", "inspect", "--rule", "api", "--identity", "203.0.113.5",
                     stdout=out)
        assert "remaining  0" in out.getvalue() and "BLOCKED" in out.getvalue()
        assert "203.0.113.5" not in out.getvalue().split("key")[1].splitlines()[0]
        call_command("ratelimit", "reset", "--rule", "0", "--identity", "203.0.113.5",
                     stdout=io.StringIO())
        assert client.get("/api/plain/", REMOTE_ADDR="203.0.113.5").status_code == 200
        # a decorated view, named by its dotted path
        for _ in range(3):
            client.get("/fixed/", REMOTE_ADDR="203.0.113.5")
        out = io.StringIO()
        call_command("ratelimit", "inspect", "--view", "tests.urls_ratelimit.fixed",
                     "--rate", "2/m", "--identity", "203.0.113.5", stdout=out)
        assert "BLOCKED" in out.getvalue()
        with pytest.raises(CommandError, match="no RATELIMIT rule"):
            call_command("ratelimit", "inspect", "--rule", "nope", "--identity", "x")


@pytest.mark.parametrize(("section", "named"), [
    ({"TRUSTED_PROXIES": ["10.0.0.0/33"]}, "'10.0.0.0/33'"),
    ({"TRUSTED_PROXIES": ["proxy.internal"]}, "'proxy.internal'"),
    ({"IPV6_PREFIX": 0}, "IPV6_PREFIX"),
    ({"VIEW": "tests.urls_ratelimit.no_such_view"}, "no_such_view"),
])
def test_bad_section_values_fail_at_startup(section: dict[str, Any], named: str) -> None:
    with (override_settings(REDIS_PATTERNS=patterns(**section)),
          pytest.raises(ConfigurationError) as info):
        RateLimitMiddleware(lambda request: None)
    assert named in str(info.value)
