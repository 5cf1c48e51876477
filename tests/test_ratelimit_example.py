"""The example project's rate-limit page: its endpoints answer with Redis up and down, and
the page counts what happened (it showed "0 x 200, 10 x 429" for ten 503s or 500s)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, raw_client

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "example_project/demo/templates/demo/ratelimit.html"

SCRIPT = r'''
import json, django
from django.test.utils import setup_test_environment
django.setup()
setup_test_environment()
from django.test import Client
client = Client()
out = []
for algorithm in ("fixed_window", "sliding_window", "token_bucket"):
    for _ in range(6):
        r = client.get(f"/ratelimit/{algorithm}/", HTTP_ACCEPT="application/json")
        out.append([algorithm, r.status_code, r.json().get("decided") if r.status_code == 200
                    else None, "RateLimit" in r])
reset = client.post("/ratelimit/reset/")
out.append(["reset", reset.status_code, None, False])
print(json.dumps(out))
'''


def run_example(redis_url: str) -> list[list[object]]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings",
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT / "example_project")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_endpoints_block_the_sixth_request(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    # A server of its own: the example project writes under its own prefixes, not the tests'.
    redis_url = redis_server_factory().url
    outcomes = run_example(redis_url)
    assert outcomes[-1] == ["reset", 200, None, False]
    for algorithm in ("fixed_window", "sliding_window", "token_bucket"):
        mine = [o for o in outcomes if o[0] == algorithm]
        assert [o[1] for o in mine] == [200] * 5 + [429], mine
        assert all(o[2] is True and o[3] for o in mine[:5])
    client = raw_client(redis_url)
    for key in client.scan_iter(match="demo:*"):  # the example's KEY_PREFIX
        assert client.pttl(key) > 0, key
        client.delete(key)


def test_endpoints_answer_undecided_when_redis_is_down(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    server.kill()
    *outcomes, reset = run_example(server.url)
    # was a 500 (AttributeError: the view read request.ratelimit, which was never set)
    assert {(o[1], o[2], o[3]) for o in outcomes} == {(200, False, False)}, outcomes
    assert reset == ["reset", 503, None, False]


def summarize(outcomes: list[dict[str, object]]) -> str:
    """Run the page's own summarize() in Node on ``outcomes``."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    source = TEMPLATE.read_text()
    match = re.search(r"function summarize\(outcomes\) \{.*?\n\}", source, re.S)
    assert match, "the rate-limit page has no summarize(outcomes) function"
    program = f"{match.group(0)}\nconsole.log(summarize({json.dumps(outcomes)}));"
    result = subprocess.run([node, "-e", program], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


TIMES = "\u00d7"  # the page's multiplication sign


def test_page_counts_what_happened() -> None:
    ok = {"status": 200, "decided": True}
    assert summarize([ok] * 3 + [{"status": 429, "decided": None}] * 7) == (
        f"3 {TIMES} 200, 7 {TIMES} 429")
    assert summarize([{"status": 200, "decided": False}] * 10) == (
        f"10 {TIMES} 200 (not decided)")
    assert summarize([{"status": 503, "decided": None}] * 4 + [ok]) == (
        f"1 {TIMES} 200, 4 {TIMES} 503")
    assert summarize([{"status": 500, "decided": None}]) == f"1 {TIMES} 500"
