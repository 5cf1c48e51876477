"""The suite's managed mode (``.ci/managed_redis.py run --tls``): what the command it runs
gets is a TLS-only, locked-down server, a least-privilege app user and an encrypted client
key, as the docs say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tls_servers import tls_skip_reason

ROOT = Path(__file__).resolve().parent.parent

PROBE = r'''
import json, os, ssl, urllib.parse
import redis
from tests.redis_servers import KEY_PREFIX

url, harness = os.environ["REDIS_URL"], os.environ["RPTEST_HARNESS_URL"]
tls = {"ssl_ca_certs": os.environ["REDIS_TLS_CA_CERTS"],
       "ssl_certfile": os.environ["REDIS_TLS_CERTFILE"],
       "ssl_keyfile": os.environ["REDIS_TLS_KEYFILE"],
       "ssl_password": os.environ["REDIS_TLS_KEY_PASSWORD"]}
port = urllib.parse.urlsplit(url).port
seen = {"schemes": [url.split(":")[0], harness.split(":")[0]]}

def outcome(call):
    try:
        return repr(call())
    except Exception as exc:
        return type(exc).__name__

app = redis.Redis.from_url(url, socket_timeout=10, **tls)
key = KEY_PREFIX + ":probe"
seen["app set"] = outcome(lambda: app.set(key, "1", ex=30))
seen["app delete"] = outcome(lambda: app.delete(key))
seen["app config"] = outcome(lambda: app.config_get("maxmemory"))
seen["app other key"] = outcome(lambda: app.get("someone-else"))
admin = redis.Redis.from_url(harness, socket_timeout=10, **tls)
for name, call in [("flushall", admin.flushall), ("keys", lambda: admin.keys("*"))]:
    seen["harness " + name] = outcome(call)
# (DEBUG is also off in redis-server by default: ask the ACL itself)
for command in [["DEBUG", "SLEEP", "0"], ["CLIENT", "KILL", "ID", "1"], ["MONITOR"]]:
    answer = admin.execute_command("ACL", "DRYRUN", "harness", *command)
    seen["harness " + command[0].lower()] = "OK" if answer in (b"OK", "OK") else "refused"
seen["plain tcp"] = outcome(lambda: redis.Redis(port=port, socket_timeout=3).ping())
no_cert = {k: v for k, v in tls.items() if k == "ssl_ca_certs"}
seen["no client cert"] = outcome(
    lambda: redis.Redis.from_url(url, socket_timeout=3, **no_cert).ping())
context = ssl.create_default_context()
try:
    context.load_cert_chain(tls["ssl_certfile"], tls["ssl_keyfile"], password="wrong")
    seen["key"] = "loads without its passphrase"
except ssl.SSLError:
    seen["key"] = "encrypted"
print("PROBE " + json.dumps(seen))
'''


@pytest.mark.topology
def test_the_managed_tls_mode_is_tls_only_locked_down_and_least_privilege() -> None:
    reason = tls_skip_reason()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "managed_redis.py"), "run", "--tls", "--",
         sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE "))
    seen = json.loads(line.removeprefix("PROBE "))
    assert seen == {
        "schemes": ["rediss", "rediss"],
        "app set": "True", "app delete": "1",
        "app config": "NoPermissionError", "app other key": "NoPermissionError",
        "harness flushall": "NoPermissionError", "harness keys": "NoPermissionError",
        "harness debug": "refused", "harness client": "refused", "harness monitor": "refused",
        "plain tcp": "ConnectionError", "no client cert": "ConnectionError",
        "key": "encrypted",
    }
    assert "shared Redis check" in done.stdout  # another program's keys were checked
    for secret in ("REDIS_TLS_KEY_PASSWORD", "tls-key-passphrase"):
        assert secret not in done.stdout + done.stderr
