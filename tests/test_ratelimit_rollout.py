"""Draft-12 RateLimit headers, shadow rules and callable (per-tier) rates."""

from __future__ import annotations

import base64
import logging
import re
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings

from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.middleware import RateLimitMiddleware
from django_redispatterns.ratelimit import RateLimiter, ratelimit
from django_redispatterns.signals import ratelimit_blocked

# Every key written here must expire: checked after each test by conftest's autouse fixture.
pytestmark = pytest.mark.urls("tests.urls_ratelimit")

MIDDLEWARE = "django_redispatterns.middleware.RateLimitMiddleware"


def patterns(**ratelimit: Any) -> dict[str, Any]:
    return {"CONNECTION": "default", "KEY_PREFIX": "rptest", "RATELIMIT": ratelimit}


def with_middleware(*rules: dict[str, Any], **extra: Any) -> Any:
    from django.conf import settings

    return override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE],
                             REDIS_PATTERNS=patterns(RULES=list(rules), **extra))


def drf(**rates: str) -> Any:
    return override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": rates})


class Signals:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append(kwargs)

    def __enter__(self) -> Signals:
        ratelimit_blocked.connect(self)
        return self

    def __exit__(self, *exc: object) -> None:
        ratelimit_blocked.disconnect(self)


def items(header: str) -> dict[str, dict[str, str]]:
    """A structured-field list of items with parameters -> {name: {param: value}}."""
    out = {}
    for item in header.split(", "):
        name, *params = item.split(";")
        out[name.strip('"')] = dict(p.split("=", 1) for p in params)
    return out


# --- IETF RateLimit headers ----------------------------------------------------------------------


def test_headers_follow_the_ietf_draft(client: Client) -> None:
    response = client.get("/fixed/", REMOTE_ADDR="192.0.2.80")
    assert items(response["RateLimit-Policy"]) == {"default": {"q": "2", "w": "60"}}
    state = items(response["RateLimit"])["default"]
    assert state["r"] == "1" and 59 <= int(state["t"]) <= 60
    assert set(state) == {"r", "t", "pk"}


def test_partition_key_is_a_keyed_hash_never_the_identity(client: Client) -> None:
    first = items(client.get("/fixed/", REMOTE_ADDR="192.0.2.81")["RateLimit"])["default"]
    again = items(client.get("/fixed/", REMOTE_ADDR="192.0.2.81")["RateLimit"])["default"]
    other = items(client.get("/fixed/", REMOTE_ADDR="192.0.2.82")["RateLimit"])["default"]
    pk = first["pk"]
    assert re.fullmatch(r":[A-Za-z0-9+/]+={0,2}:", pk)  # a structured-field byte sequence
    raw = base64.b64decode(pk.strip(":"))
    assert len(raw) == 12 and b"192.0.2.81" not in raw
    assert pk == again["pk"] and pk != other["pk"]  # stable per client, distinct per client
    limiter = RateLimiter("2/m", group="tests.urls_ratelimit.fixed")
    digest = limiter.digest("ip:192.0.2.81")
    assert digest not in pk and base64.b64encode(bytes.fromhex(digest)[:12]).decode() not in pk
    with override_settings(SECRET_KEY="another-secret-key-for-this-test-only-0123456789"):
        rotated = items(client.get("/fixed/", REMOTE_ADDR="192.0.2.81")["RateLimit"])
    assert rotated["default"]["pk"] != pk  # keyed: a new SECRET_KEY, a new partition key


def test_a_rule_whose_requests_cost_more_says_so(client: Client) -> None:
    response = client.get("/costly/", REMOTE_ADDR="192.0.2.83")
    policy = items(response["RateLimit-Policy"])["export"]
    assert policy == {"q": "10", "qu": '"requests"', "w": "60"}
    state = items(response["RateLimit"])["export"]
    assert state["r"] == "7" and "c" not in state  # no parameter outside the draft's
    assert response["RateLimit-Policy"] == '"export";q=10;qu="requests";w=60'


@pytest.mark.parametrize("legacy", [True, False])
def test_legacy_trio_is_behind_a_setting(client: Client, legacy: bool) -> None:
    with override_settings(REDIS_PATTERNS=patterns(LEGACY_HEADERS=legacy)):
        response = client.get("/fixed/", REMOTE_ADDR="192.0.2.84")
    assert ("RateLimit-Limit" in response) is legacy
    assert ("RateLimit-Remaining" in response) is legacy
    assert ("RateLimit-Reset" in response) is legacy
    assert "RateLimit" in response and "RateLimit-Policy" in response
    if legacy:
        assert response["RateLimit-Limit"] == "2" and response["RateLimit-Remaining"] == "1"


def test_legacy_headers_setting_is_validated() -> None:
    with (override_settings(REDIS_PATTERNS=patterns(LEGACY_HEADERS="yes")),
          pytest.raises(ConfigurationError, match="LEGACY_HEADERS")):
        RateLimitMiddleware(lambda request: None)


def test_redirects_carry_no_rate_limit_fields(client: Client) -> None:
    with with_middleware({"path": r"^/api/", "rate": "5/m"}):
        response = client.get("/api/redirect/", REMOTE_ADDR="192.0.2.85")
    assert response.status_code == 302
    assert not [h for h in response.headers if h.lower().startswith("ratelimit")]


# --- shadow rules --------------------------------------------------------------------------


def test_shadow_decorator_counts_logs_signals_and_never_blocks(client: Client,
                                                              caplog: Any) -> None:
    with Signals() as signals, caplog.at_level(logging.INFO,
                                               logger="django_redispatterns.ratelimit"):
        responses = [client.get("/shadowed/", REMOTE_ADDR="192.0.2.86") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert [r.json()["shadow"] for r in responses] == [[True], [True], [False], [False]]
    assert all(r.json()["limited"] is False for r in responses)
    assert not [h for r in responses for h in r.headers if h.lower().startswith("ratelimit")]
    assert [c["shadow"] for c in signals.calls] == [True, True]
    assert signals.calls[0]["rule"].startswith("tests.urls_ratelimit.shadowed 2/60s")
    assert caplog.text.count("would block (shadow rule)") == 2
    assert "192.0.2.86" not in caplog.text
    # it counted: the log holds exactly what an enforcing rule would have admitted
    assert RateLimiter("2/m", group="tests.urls_ratelimit.shadowed").peek(
        "ip:192.0.2.86").remaining == 0


def test_shadow_rule_next_to_an_enforcing_one(client: Client) -> None:
    responses = [client.get("/shadow-and-live/", REMOTE_ADDR="192.0.2.87") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    last = responses[-1]
    assert last.json() == {"limited": False, "remaining": 2, "shadow": [False]}
    assert list(items(last["RateLimit-Policy"])) == ["live"]  # the shadow rule is invisible


def test_shadow_middleware_rule(client: Client) -> None:
    with Signals() as signals, with_middleware(
            {"path": r"^/api/", "rate": "1/m", "shadow": True, "name": "trial"}):
        codes = [client.get("/api/plain/", REMOTE_ADDR="192.0.2.88").status_code
                 for _ in range(3)]
    assert codes == [200, 200, 200]
    assert [c["shadow"] for c in signals.calls] == [True, True]


def test_shadow_rule_never_fails_closed(redis_server_factory: Any, client: Client) -> None:
    server = redis_server_factory()
    server.kill()
    rule = {"path": r"^/api/", "rate": "1/m", "shadow": True}
    with with_middleware(rule, CONNECTION=server.url, FAIL_OPEN=False):
        assert client.get("/api/plain/", REMOTE_ADDR="192.0.2.89").status_code == 200
    with with_middleware(rule, {"path": r"^/api/", "rate": "5/m"}, CONNECTION=server.url,
                         FAIL_OPEN=False):
        assert client.get("/api/plain/", REMOTE_ADDR="192.0.2.89").status_code == 503


def test_shadow_drf_throttle() -> None:
    from rest_framework.settings import api_settings

    with drf(tests="1/min"), Signals() as signals:
        api_settings.reload()
        codes = [Client().get("/drf-shadow/", REMOTE_ADDR="192.0.2.90").status_code
                 for _ in range(3)]
    api_settings.reload()
    assert codes == [200, 200, 200]
    assert [c["shadow"] for c in signals.calls] == [True, True]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_shadow_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="shadow"):
        ratelimit("5/m", shadow=value)
    with (override_settings(REDIS_PATTERNS=patterns(RULES=[{"rate": "5/m", "shadow": value}])),
          pytest.raises(ConfigurationError, match="shadow")):
        RateLimitMiddleware(lambda request: None)


# --- callable rates ------------------------------------------------------------------------


def test_callable_rate_per_tier(client: Client) -> None:
    def codes(tier: str, n: int) -> list[int]:
        return [client.get(f"/tiered/?tier={tier}", REMOTE_ADDR="192.0.2.91").status_code
                for _ in range(n)]

    assert codes("free", 3) == [200, 200, 429]
    assert codes("pro", 5) == [200, 200, 200, 200, 429]  # its own budget at its own rate
    staff = client.get("/tiered/?tier=staff", REMOTE_ADDR="192.0.2.91")
    assert staff.status_code == 200 and "RateLimit" not in staff  # None: not limited
    pro = client.get("/tiered/?tier=pro", REMOTE_ADDR="192.0.2.92")
    assert items(pro["RateLimit-Policy"])["default"] == {"q": "4", "w": "60"}


def test_django_ratelimit_style_rate_callable(client: Client) -> None:
    codes = [client.get("/legacy-tiered/", REMOTE_ADDR="192.0.2.93").status_code
             for _ in range(4)]
    assert codes == [200, 200, 200, 429]


def test_middleware_rate_from_a_dotted_path(client: Client) -> None:
    with with_middleware({"path": r"^/api/", "rate": "tests.urls_ratelimit.tier_rate"}):
        codes = [client.get("/api/plain/?tier=free", REMOTE_ADDR="192.0.2.94").status_code
                 for _ in range(3)]
    assert codes == [200, 200, 429]


def test_drf_throttle_with_a_callable_rate() -> None:
    from rest_framework.settings import api_settings

    with drf():
        api_settings.reload()
        codes = [Client().get("/drf-tiers/?tier=free", REMOTE_ADDR="192.0.2.95").status_code
                 for _ in range(3)]
        staff = Client().get("/drf-tiers/?tier=staff", REMOTE_ADDR="192.0.2.95")
    api_settings.reload()
    assert codes == [200, 200, 429] and staff.status_code == 200


def test_a_callable_rate_returning_garbage_names_it() -> None:
    view = ratelimit(lambda request: "lots")(lambda request: None)
    with pytest.raises(ConfigurationError, match="'lots'"):
        view(RequestFactory().get("/", REMOTE_ADDR="192.0.2.96"))


def test_a_callable_rates_cost_is_checked_against_the_rate_it_returns() -> None:
    view = ratelimit(lambda request: "2/m", cost=3)(lambda request: None)
    with pytest.raises(ConfigurationError, match="cost"):
        view(RequestFactory().get("/", REMOTE_ADDR="192.0.2.97"))


@pytest.mark.parametrize(("rate", "named"), [
    ("tests.urls_ratelimit.no_such_rate", "cannot be imported"),
    ("nosuch.module.rate", "cannot be imported"),
    ("ten/m", "'ten/m'"),
])
def test_bad_rate_sources_fail_at_startup(rate: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        ratelimit(rate)
    with (override_settings(REDIS_PATTERNS=patterns(RULES=[{"rate": rate}])),
          pytest.raises(ConfigurationError, match=named)):
        RateLimitMiddleware(lambda request: None)


def test_command_needs_the_tier_of_a_callable_rate(client: Client) -> None:
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    for _ in range(3):
        client.get("/tiered/?tier=free", REMOTE_ADDR="192.0.2.98")
    with pytest.raises(CommandError, match="callable rate"):
        call_command("ratelimit", "inspect", "--view", "tests.urls_ratelimit.tiered",
                     "--identity", "192.0.2.98")
    out = io.StringIO()
    call_command("ratelimit", "inspect", "--view", "tests.urls_ratelimit.tiered",
                 "--rate", "2/m", "--identity", "192.0.2.98", stdout=out)
    assert "BLOCKED" in out.getvalue()
