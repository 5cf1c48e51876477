"""A Redis that other software uses too, for running the test suite against it (REDIS_URL).

    python .ci/shared_redis.py seed URL MANIFEST     # write another program's keys
    python .ci/shared_redis.py verify URL MANIFEST [--whole-server]
                                                     # after the suite: all intact, nothing left

``seed`` writes keys of every type, with and without a TTL, including names close to the
suite's own (``rptest:...``, another run's ``rptest-<run>-gw0:...``, the example project's
``demo:...``), in the URL's database and in the next one, and records them. ``verify``
checks each is still there with the same value (DUMP) and TTL state, and that the suite
left no key behind in those databases (with ``--whole-server``: in any database).
A ``rediss://`` URL takes its certificates from ``REDIS_TLS_CA_CERTS``,
``REDIS_TLS_CERTFILE``, ``REDIS_TLS_KEYFILE`` and ``REDIS_TLS_KEY_PASSWORD``, as the suite's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

NO_TTL, TTL = None, 36_000
TLS_ENV = {"ssl_ca_certs": "REDIS_TLS_CA_CERTS", "ssl_certfile": "REDIS_TLS_CERTFILE",
           "ssl_keyfile": "REDIS_TLS_KEYFILE", "ssl_password": "REDIS_TLS_KEY_PASSWORD"}


def connect(url: str) -> redis.Redis:
    """A client of ``url`` (with the certificates of the environment for ``rediss://``)."""
    tls = ({kw: os.environ[name] for kw, name in TLS_ENV.items() if os.environ.get(name)}
           if url.startswith("rediss://") else {})
    return redis.Redis.from_url(url, **tls)


def canaries(client: redis.Redis) -> None:
    client.set("rptest:legacy:no-ttl", "an older checkout's key")
    client.set("rptest-0ther1-gw0:lock:{locks}:held:report", "another run", ex=TTL)
    client.set("rptest-0ther1-gw1:rl:x", "another run, no TTL")
    client.set("demo:lock:{locks}:fence:nightly_report", "7")
    client.set("*:1:a", "django-redis's suite name")
    client.set("rpcap:x", "capacity name", ex=TTL)
    client.set("myapp:session:42", "a user's session")
    client.set("myapp:cache:home", "<html>", ex=TTL)
    client.hset("myapp:user:1", mapping={"name": "Ada", "plan": "pro"})
    client.rpush("myapp:queue", "job1", "job2")
    client.sadd("myapp:tags", "a", "b")
    client.zadd("myapp:board", {"ada": 3, "bob": 1})
    client.expire("myapp:board", TTL)
    client.xadd("myapp:events", {"kind": "signup"})


def shown(url: str) -> str:
    """``url`` without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}", query=""))


def databases(url: str) -> list[str]:
    db = connect(url).connection_pool.connection_kwargs.get("db", 0)
    return [with_db(url, int(db)), with_db(url, int(db) + 1)]


def snapshot(client: redis.Redis) -> dict[str, list[object]]:
    return {key.decode(): [client.dump(key).hex(), client.ttl(key) > 0]  # type: ignore[union-attr]
            for key in client.scan_iter(count=1000)}


def seed(url: str, manifest: Path) -> None:
    state = {}
    for db_url in databases(url):
        client = connect(db_url)
        if client.dbsize():
            sys.exit(f"{shown(db_url)} is not empty: seed a database nobody else uses")
        canaries(client)
        state[db_url] = snapshot(client)
    manifest.write_text(json.dumps(state))
    print(f"seeded {sum(map(len, state.values()))} keys of another program in "
          f"{', '.join(map(shown, state))}")


def verify(url: str, manifest: Path, whole_server: bool = False) -> None:
    state = json.loads(manifest.read_text())
    problems = []
    for db_url, before in state.items():
        after = snapshot(connect(db_url))
        for key, (dump, expires) in before.items():
            if key not in after:
                problems.append(f"{shown(db_url)}: {key!r} was deleted")
            elif after[key][0] != dump:
                problems.append(f"{shown(db_url)}: {key!r} was changed")
            elif after[key][1] != expires:
                problems.append(f"{shown(db_url)}: {key!r} TTL changed")
        left = sorted(set(after) - set(before))
        if left:
            problems.append(f"{shown(db_url)}: the suite left {len(left)} keys behind: "
                            f"{left[:20]}")
    checked = {urlsplit(db).path for db in state}
    keyspace = connect(url).info("keyspace")
    others = {f"/{name[2:]}": info for name, info in keyspace.items()
              if f"/{name[2:]}" not in checked}
    if whole_server and others:
        problems.append(f"keys written in other databases: {others}")
    if problems:
        sys.exit("shared Redis check failed:\n  " + "\n  ".join(problems))
    print(f"shared Redis check: {sum(map(len, state.values()))} keys of another program intact, "
          "no key left behind")


if __name__ == "__main__":
    command, url, path = sys.argv[1:4]
    if command == "seed":
        seed(url, Path(path))
    else:
        verify(url, Path(path), whole_server="--whole-server" in sys.argv[4:])
