"""The soak against Redis Cluster (``./dev soak --cluster``).

Three masters with one replica each, started here from ``redis-server`` on ports
30000-30999, while under the checking load:

* the slots holding hot keys of every feature migrate one by one (``CLUSTER SETSLOT ...
  MIGRATING/IMPORTING`` and ``MIGRATE`` in small batches, so each slot stays split between
  two nodes for a while): the app meets ``ASK`` and ``TRYAGAIN``, then ``MOVED``;
* a master is promoted away with ``CLUSTER FAILOVER`` (graceful), and another is killed
  (``SIGKILL``): its replica takes over after the node timeout (2 s);
* a fourth master joins and slots move to it, hot slots first (a partial rebalance: 6
  slots per master in the short run, 128 in the full one).

The killed master's writes that had not reached its replica may be lost, as on a single
server restarted without persistence: the checks treat that window the same way.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import redis

from soak.run import Phase, ttl_audit
from tests.topologies import ClusterNode, ClusterTopology, wait_for

PORTS = range(30000, 30500)  # data ports; each node's bus port is its port + 500

SHORT: list[Phase] = [
    ("steady", 5, None, False),
    ("hot slots migrate one by one", 6, "migrate_hot", True),
    ("after the migrations", 4, None, False),
    ("CLUSTER FAILOVER (graceful)", 3, "failover", True),
    ("after the failover", 4, None, False),
    ("a master killed (SIGKILL)", 2, "kill_master", True),
    ("after its replica took over", 4, "promoted", False),
    ("a fourth master joins; slots rebalance", 6, "join", True),
    # At least the idempotency lease + margin: an orphaned claim must end before the stop.
    ("after the rebalance", 14, None, False),
]
FULL: list[Phase] = [
    ("steady", 30, None, False),
    ("hot slots migrate one by one", 20, "migrate_hot", True),
    ("after the migrations", 20, None, False),
    ("CLUSTER FAILOVER (graceful)", 5, "failover", True),
    ("after the failover", 20, None, False),
    ("a master killed (SIGKILL)", 3, "kill_master", True),
    ("after its replica took over", 20, "promoted", False),
    ("a fourth master joins; slots rebalance", 30, "join", True),
    ("after the rebalance", 45, None, False),
]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SoakNode(ClusterNode):
    """A cluster node on the soak's port range (the bus on port + 500)."""

    def __init__(self) -> None:
        port = next((p for p in PORTS if _port_is_free(p) and _port_is_free(p + 500)), None)
        if port is None:
            raise RuntimeError("no free port pair in 30000-30999 for a cluster node")
        super().__init__(port=port)

    def choose_extra_ports(self) -> None:
        self.bus_port = self.port + 500


class SoakCluster:
    """The cluster, and the fault actions the timeline names (one method each)."""

    def __init__(self, full: bool) -> None:
        self.full = full
        self.topology = ClusterTopology(masters=3, replicas=1, node=SoakNode)
        masters = self.topology.masters()
        # The probe's node is never failed over or killed; one of each for the others.
        self.probe_node, self.to_fail_over, self.to_kill = masters[0], masters[1], masters[2]
        self.port = self.probe_node.port
        self.log: list[str] = []

    def __repr__(self) -> str:
        return f"redis cluster {[n.port for n in self.topology.nodes]}"

    @property
    def url(self) -> str:
        return self.topology.url

    def stop(self) -> None:
        self.topology.stop()

    def _note(self, line: str) -> None:
        self.log.append(f"{time.time():.3f} {line}")

    # --- slot moves -------------------------------------------------------------------

    def hot_slots(self) -> dict[str, int]:
        """One slot per key family (``soak:rl``, ``soak:sess``, ``soak-default``...) that
        holds keys now."""
        found: dict[str, int] = {}
        client = self.topology.client()
        for node in self.topology.masters():
            for key in node.client().scan_iter(count=1000):
                parts = key.decode(errors="replace").split(":")
                family = ":".join(parts[:2]) if parts[0] == "soak" else parts[0]
                found.setdefault(family, client.keyslot(key))
        client.close()
        return found

    def move(self, slot: int, target: ClusterNode, batch: int = 5, pause: float = 0.02) -> None:
        """Migrate ``slot`` to ``target`` a few keys at a time (the slot stays split)."""
        source = self.topology.migrate_slot_start(slot, target)
        src = source.client(socket_timeout=5)
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            # A node still catching up on gossip may answer CLUSTERDOWN for a moment.
            wait_for(lambda ks=keys: self._migrate(source, target, ks), 10,
                     f"MIGRATE of slot {slot} to {target.port}")
            time.sleep(pause)
        self.topology.migrate_slot_finish(slot, source, target)

    def _migrate(self, source: ClusterNode, target: ClusterNode, keys: list[bytes]) -> bool:
        try:
            self.topology.migrate_keys(source, target, [k.decode() for k in keys])
        except redis.ResponseError as exc:
            if "CLUSTERDOWN" not in str(exc) and "TRYAGAIN" not in str(exc):
                raise
            return False
        return True

    def migrate_hot(self) -> None:
        masters = self.topology.masters()
        for family, slot in sorted(self.hot_slots().items()):
            owner = self.topology.master_for_slot(slot)
            target = masters[(masters.index(owner) + 1) % len(masters)]
            self.move(slot, target)
            self._note(f"slot {slot} ({family}) {owner.port} -> {target.port}")

    # --- failover, crash --------------------------------------------------------------

    def failover(self) -> None:
        master = self.to_fail_over
        replica = self.topology.replica_of(master)
        self.topology.wait_replicated(master)
        replica.client().execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: replica.is_master() and not master.is_master(), 30,
                 "CLUSTER FAILOVER to promote the replica")
        self._note(f"failover: {replica.port} promoted over {master.port}")

    def kill_master(self) -> None:
        self.to_kill.kill()
        self._note(f"killed master {self.to_kill.port}")

    def promoted(self) -> None:
        """Until the killed master's replica serves its slots (every slot covered)."""
        self.topology.wait_healthy(timeout=60)
        self._note("cluster_state:ok after the kill")

    # --- a fourth master --------------------------------------------------------------

    def join(self) -> None:
        new = SoakNode()
        self.topology.nodes.append(new)
        anchor = self.probe_node.client()
        anchor.execute_command("CLUSTER", "MEET", "127.0.0.1", new.port, new.bus_port)
        known = len(self.topology.nodes)
        wait_for(lambda: int(new.cluster_info()["cluster_known_nodes"]) == known, 30,
                 "the new master to meet the cluster")
        wait_for(lambda: all(int(n.cluster_info()["cluster_known_nodes"]) == known
                             for n in self.topology.masters()), 30, "every node to meet it")
        # Until it has learnt who owns every slot, the new node answers CLUSTERDOWN.
        wait_for(lambda: new.cluster_info()["cluster_state"] == "ok", 30,
                 "the new master to see every slot covered")
        masters = [m for m in self.topology.masters() if m.port != new.port]
        hot = set(self.hot_slots().values())
        # Hot slots first, then others: a partial rebalance (each move is several admin
        # round trips per node; a whole quarter of the slots would outlast the run).
        per_master = 128 if self.full else 6
        moved = 0
        for master in masters:
            own = self._slots_of(master)
            chosen = [s for s in own if s in hot] + [s for s in own if s not in hot]
            for slot in chosen[:per_master]:
                self.move(slot, new, batch=50, pause=0.0)
                moved += 1
        self._note(f"joined {new.port}; {moved} slots moved to it")

    def _slots_of(self, master: ClusterNode) -> list[int]:
        node_id = master.node_id
        slots: list[int] = []
        for start, end, primary, *_ in master.client().execute_command("CLUSTER", "SLOTS"):
            if str(primary[2], "ascii") == node_id:
                slots.extend(range(start, end + 1))
        return slots

    # --- the end ----------------------------------------------------------------------

    def ttl_audit(self) -> dict[str, Any]:
        """Every master's keys, SCANned and PTTL'd (the single-server audit, per master)."""
        total: dict[str, Any] = {"keys": 0, "no_ttl": 0, "by_prefix": {}, "examples": [],
                                 "masters": 0}
        for node in self.topology.masters():
            part = ttl_audit(node.client(socket_timeout=5))
            total["masters"] += 1
            total["keys"] += part["keys"]
            total["no_ttl"] += part["no_ttl"]
            total["examples"] += part["examples"][:10 - len(total["examples"])]
            for prefix, n in part["by_prefix"].items():
                total["by_prefix"][prefix] = total["by_prefix"].get(prefix, 0) + n
        return total

    def crossslot_errors(self) -> int:
        """``CROSSSLOT`` errors every live node counted (Redis >= 7 error stats)."""
        count = 0
        for node in self.topology.live_nodes():
            try:
                stats = node.client(socket_timeout=5).info("errorstats")
            except redis.RedisError:
                continue
            count += int(stats.get("errorstat_CROSSSLOT", {}).get("count", 0))
        return count
