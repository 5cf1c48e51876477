"""``manage.py redis_audit``: keys without a TTL, the largest keys, and eviction settings.

Walks the keyspace with ``SCAN ... COUNT`` (never ``KEYS``), so Redis keeps serving other
clients between batches; each batch's ``PTTL`` and ``MEMORY USAGE`` calls go out in one
pipeline. On Redis Cluster every master is scanned. Only reads; never writes.
"""

from __future__ import annotations

import heapq
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_redispatterns import connection as connections
from django_redispatterns import scripts
from django_redispatterns.checks import read_facts
from django_redispatterns.conf import get_config
from django_redispatterns.keys import glob_escape

from ..base import RedisCommand, describe, printable

# Distinct no-TTL patterns tracked; the rest are counted together.
MAX_GROUPS = 10_000
OTHER = "(other patterns)"

_DIGITS = re.compile(r"\d+")
_HEXISH = re.compile(r"^[0-9a-fA-F-]{8,}$")
_TAG = re.compile(r"\{[^}]*\}")


def key_pattern(key: str, keep: str = "") -> str:
    """Fold the variable parts of a key name into ``*`` so similar keys group together.

    ``user:42:profile`` -> ``user:*:profile``; ``session:3f2a...`` -> ``session:*``;
    ``rp:rl:{ab12}:x`` -> ``rp:rl:{*}:x``; ``job17`` -> ``job*``. A key under the prefix
    ``keep`` keeps it literally (``app2:lock:x`` stays ``app2:lock:x``), so the app's own
    keys are still recognised when its prefix holds digits.
    """
    if keep and key.startswith(f"{keep}:"):
        return f"{keep}:{key_pattern(key[len(keep) + 1:])}"
    parts = []
    for part in _TAG.sub("{*}", key).split(":"):
        has_digit = any(c.isdigit() for c in part)
        if has_digit and (part.isdigit() or _HEXISH.match(part) or len(part) >= 16):
            parts.append("*")
        else:
            parts.append(_DIGITS.sub("*", part))
    return ":".join(parts)


def _decode(key: bytes | str) -> str:
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key


def _human(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


@dataclass
class Report:
    """What the audit found, over every scanned server."""

    prefix: str | None
    servers: list[dict[str, Any]] = field(default_factory=list)
    scanned: int = 0
    measured: int = 0
    memory_usage_available: bool = True
    unreadable: int = 0  # keys whose TTL the connected user may not read (ACL key patterns)
    no_ttl: Counter[str] = field(default_factory=Counter)
    no_ttl_examples: dict[str, str] = field(default_factory=dict)
    largest: list[tuple[int, str, str]] = field(default_factory=list)  # heap: bytes, key, node
    details: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    connection: str = ""  # as shown to people: a URL without its password
    our_prefix: str = ""  # the app's KEY_PREFIX: its keys keep it in their patterns

    @property
    def no_ttl_count(self) -> int:
        return sum(self.no_ttl.values())

    def add_no_ttl(self, key: str) -> None:
        pattern = key_pattern(key, self.our_prefix)
        if pattern not in self.no_ttl and len(self.no_ttl) >= MAX_GROUPS:
            pattern = OTHER
        self.no_ttl[pattern] += 1
        self.no_ttl_examples.setdefault(pattern, key)

    def add_size(self, size: int, key: str, node: str, top: int) -> None:
        entry = (size, key, node)
        if len(self.largest) < top:
            heapq.heappush(self.largest, entry)
        elif top and entry > self.largest[0]:
            heapq.heapreplace(self.largest, entry)

    def as_dict(self, our_prefix: str) -> dict[str, Any]:
        largest = sorted(self.largest, reverse=True)
        return {
            "connection": self.connection,
            "prefix": self.prefix,
            "servers": self.servers,
            "scanned": self.scanned,
            "measured": self.measured,
            "memory_usage_available": self.memory_usage_available,
            "unreadable": self.unreadable,
            "seconds": round(self.seconds, 3),
            "no_ttl": {
                "count": self.no_ttl_count,
                "groups": [
                    {"pattern": pattern, "count": count,
                     "example": self.no_ttl_examples[pattern],
                     "ours": pattern.startswith(f"{our_prefix}:")}
                    for pattern, count in self.no_ttl.most_common()
                ],
            },
            "largest": [
                {"key": key, "bytes": size, "server": node,
                 "type": self.details.get((node, key), ("?", -2))[0],
                 "ttl_ms": self.details.get((node, key), ("?", -2))[1]}
                for size, key, node in largest
            ],
        }


class Command(RedisCommand):
    help = (
        "Audit a Redis keyspace with SCAN (never KEYS): keys without a TTL grouped by "
        "pattern, the largest keys (MEMORY USAGE), and the eviction settings."
    )
    # Seconds between progress lines on stderr (only large keyspaces take that long).
    progress_interval = 1.0

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--connection", default=None,
            help="CACHES alias or Redis URL to audit (default: REDIS_PATTERNS['CONNECTION']).",
        )
        parser.add_argument("--prefix", default=None,
                            help="Only keys whose name starts with this text.")
        parser.add_argument("--fail-on-no-ttl", action="store_true",
                            help="Exit with status 1 when any key has no TTL.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument("--count", type=int, default=1000,
                            help="SCAN COUNT hint: keys per batch (default 1000).")
        parser.add_argument(
            "--sample", type=int, default=1,
            help="Measure MEMORY USAGE of one key in N (default 1: every key; 0: none).",
        )
        parser.add_argument("--top", type=int, default=10,
                            help="How many of the largest keys to list (default 10).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] < 1 or options["sample"] < 0 or options["top"] < 0:
            raise CommandError("--count must be >= 1; --sample and --top must be >= 0.")
        conn = self.using(options["connection"] or get_config().connection_for(None))
        try:
            client = connections.client_for(conn)
        except Exception as exc:  # a bad alias or URL: say which
            raise CommandError(f"cannot use connection {describe(conn)}: "
                               f"{connections.redact_text(str(exc))}") from exc

        report = Report(prefix=options["prefix"], our_prefix=get_config().key_prefix)
        started = time.perf_counter()
        for name, node in self._nodes(client):
            self._audit_node(name, node, report, options)
        report.seconds = time.perf_counter() - started

        if options["json"]:
            report.connection = describe(conn)
            self.stdout.write(json.dumps(report.as_dict(get_config().key_prefix), indent=2))
        else:
            self._print(report, conn)
        if options["fail_on_no_ttl"] and report.no_ttl_count:
            raise CommandError(f"{report.no_ttl_count} key(s) without a TTL.", returncode=1)

    # --- scanning ---------------------------------------------------------------------

    def _nodes(self, client: Any) -> list[tuple[str, Any]]:
        """(name, plain client) of every server to scan: each master on a Cluster."""
        # A batch's keys span many slots, which a script may not touch on a Cluster.
        self._use_script = not connections.is_cluster(client)
        if connections.is_cluster(client):
            return [(f"{node.host}:{node.port}", client.get_redis_connection(node))
                    for node in client.get_primaries()]
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            name = f"unix:{kwargs['path']}"
        else:
            name = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        return [(name, client)]

    def _audit_node(self, name: str, node: Any, report: Report, options: dict[str, Any]) -> None:
        import redis

        facts = read_facts(node, name)
        try:
            total = node.dbsize()
        except redis.ResponseError:  # denied by ACL: progress shows no percentage
            total = 0
        server = {**facts.as_dict(), "keys": total, "scanned": 0}
        report.servers.append(server)

        prefix = options["prefix"]
        match = f"{glob_escape(prefix)}*" if prefix else None
        count, sample, top = options["count"], options["sample"], options["top"]
        last_progress = time.monotonic()
        cursor: int = 0
        while True:
            cursor, keys = node.scan(cursor=cursor, match=match, count=count)
            if keys:
                self._inspect(node, name, keys, report, sample, top)
                server["scanned"] += len(keys)
            if cursor == 0:
                break
            now = time.monotonic()
            if now - last_progress >= self.progress_interval:
                last_progress = now
                self._progress(name, server["scanned"], total)
        if top and report.largest:
            self._describe_largest(node, name, report)

    def _inspect(self, node: Any, name: str, keys: list[bytes], report: Report,
                 sample: int, top: int) -> None:
        stride = sample if report.memory_usage_available else 0
        probes = None
        if self._use_script:
            probes = self._probe_with_script(node, keys, stride, report.scanned)
        if probes is None:
            probes = self._probe_with_pipeline(node, keys, stride, report)
        report.scanned += len(keys)
        for key, (ttl, size) in zip(keys, probes, strict=True):
            text = _decode(key)
            if ttl == -1:
                report.add_no_ttl(text)
            if size is not None:
                report.measured += 1
                report.add_size(size, text, name, top)

    def _probe_with_script(self, node: Any, keys: list[bytes], stride: int,
                           offset: int) -> list[tuple[int, int | None]] | None:
        """One EVALSHA per batch: about twice the throughput of a pipeline."""
        import redis

        try:
            flat = scripts.script("audit_batch")(node, keys, [stride, offset])
        except redis.ResponseError:  # EVAL or MEMORY denied/renamed: use the pipeline
            self._use_script = False
            return None
        return [(flat[i], flat[i + 1] if flat[i + 1] >= 0 else None)
                for i in range(0, len(flat), 2)]

    def _probe_with_pipeline(self, node: Any, keys: list[bytes], stride: int,
                             report: Report) -> list[tuple[int, int | None]]:
        pipe = node.pipeline(transaction=False)
        measured = []
        for i, key in enumerate(keys):
            pipe.pttl(key)
            measure = stride > 0 and (report.scanned + i) % stride == 0
            measured.append(measure)
            if measure:
                pipe.memory_usage(key)
        results = iter(pipe.execute(raise_on_error=False))
        probes: list[tuple[int, int | None]] = []
        for measure in measured:
            ttl = next(results)
            size = next(results) if measure else None
            if isinstance(size, Exception):
                report.memory_usage_available = False  # disabled or denied by ACL
                size = None
            if isinstance(ttl, Exception):  # a key outside the user's ACL key patterns
                report.unreadable += 1
            probes.append((ttl if isinstance(ttl, int) else -2,
                           size if isinstance(size, int) else None))
        return probes

    def _describe_largest(self, node: Any, name: str, report: Report) -> None:
        mine = [key for _, key, node_name in report.largest if node_name == name]
        if not mine:
            return
        pipe = node.pipeline(transaction=False)
        for key in mine:
            pipe.type(key)
            pipe.pttl(key)
        answers = pipe.execute(raise_on_error=False)
        for i, key in enumerate(mine):
            kind, ttl = answers[2 * i], answers[2 * i + 1]
            report.details[(name, key)] = (
                _decode(kind) if isinstance(kind, (bytes, str)) else "?",
                ttl if isinstance(ttl, int) else -2,
            )

    def _progress(self, name: str, scanned: int, total: int) -> None:
        share = f" of ~{total:,} ({min(100, 100 * scanned // max(total, 1))}%)" if total else ""
        self.stderr.write(f"{name}: scanned {scanned:,}{share} keys...")
        self.stderr.flush()

    # --- text output ------------------------------------------------------------------

    def _print(self, report: Report, conn: str) -> None:
        out = self.stdout.write
        our_prefix = get_config().key_prefix
        scope = f" matching {report.prefix!r}*" if report.prefix else ""
        rate = report.scanned / report.seconds if report.seconds else 0.0
        out(f"Redis audit of {describe(conn)}: {report.scanned:,} keys{scope} scanned in "
            f"{report.seconds:.1f} s ({rate:,.0f} keys/s).")
        for server in report.servers:
            out("")
            out(f"Server {server['endpoint']}: {server['product']} {server['version'] or '?'}, "
                f"role {server['role'] or '?'}, {server['keys']:,} keys, "
                f"used memory {_human(server['used_memory'])}.")
            maxmemory = server["maxmemory"]
            limit = "unknown" if maxmemory is None else (
                "0 (no limit)" if maxmemory == 0 else _human(maxmemory))
            source = f" (read with {server['source']})" if server["source"] else ""
            out(f"  Eviction: maxmemory {limit}, maxmemory-policy "
                f"{server['policy'] or 'unknown'}{source}.")
            if server["error"]:
                out(f"  Settings unavailable: {server['error']}")

        out("")
        if report.no_ttl_count:
            out(f"Keys without a TTL: {report.no_ttl_count:,}", self.style.WARNING)
            out(f"  {'count':>10}  pattern (example)")
            for pattern, count in report.no_ttl.most_common(20):
                ours = "  <- written by django-redispatterns: please report" if (
                    pattern.startswith(f"{our_prefix}:")) else ""
                example = printable(report.no_ttl_examples[pattern], keep="")
                out(f"  {count:>10,}  {printable(pattern, keep='')}  ({example}){ours}")
            if len(report.no_ttl) > 20:
                out(f"  ... and {len(report.no_ttl) - 20:,} more patterns (see --json).")
        elif not report.unreadable:
            out("Keys without a TTL: none.", self.style.SUCCESS)
        else:
            out("Keys without a TTL: none among those this Redis user may read.")
        if report.unreadable:
            out(f"  {report.unreadable:,} keys were not checked: this Redis user may not read "
                "them (ACL key patterns); audit as a user that may read every key.")

        if report.largest:
            sampled = "" if report.measured >= report.scanned else (
                f" (of {report.measured:,} measured keys)")
            out("")
            out(f"Largest keys{sampled}:")
            out(f"  {'size':>10}  {'type':<6} {'ttl':>9}  key")
            for size, key, node in sorted(report.largest, reverse=True):
                kind, ttl = report.details.get((node, key), ("?", -2))
                ttl_text = {-1: "none", -2: "gone"}.get(ttl, f"{ttl / 1000:.0f}s")
                where = f"  [{node}]" if len(report.servers) > 1 else ""
                out(f"  {_human(size):>10}  {kind:<6} {ttl_text:>9}  "
                    f"{printable(key, keep='')}{where}")
        elif not report.memory_usage_available:
            out("MEMORY USAGE is unavailable on this server; largest keys not measured.")
