"""The cluster's keys in etcd and the records stored under them, as pure functions.

    /sqsq/nodes/<node id>      NodeRecord    under the node's lease: gone when the node is
                                             (liveness)
    /sqsq/members/<node id>    NodeRecord    no lease: the address book; a dead node's
                                             peers still know where to reach it when it
                                             comes back
    /sqsq/shards/<shard id>    ShardRecord   replica set (node ids) and an epoch that rises
                                             on every change of it
    /sqsq/queues/<queue key>   QueueRecord   queue id and the shard of each partition; the
                                             key is the name, "<region>/<name>" outside
                                             the configured region (sqsq.core.regions)
    /sqsq/leaders/<shard id>   LeaderHint    published by the shard's current Raft leader,
                                             under that node's lease; a hint, confirmed by
                                             the shard itself (NOT_LEADER otherwise)
    /sqsq/controller           election key  the one active controller (sqsq.control.lease)
    /sqsq/joined/<shard>/<node>  (empty)     written, create-only, before a node first opens
                                             a replica of a shard as a founding member: a
                                             node that finds it there but has no data lost
                                             its disk, and rejoins as a learner instead

Values are compact JSON objects. Decoding rejects a record that lacks a field or carries
one of the wrong type, so a corrupt or foreign key fails loudly instead of routing wrongly;
unknown fields are ignored so a newer writer can add some.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqsq.core import regions

ROOT = "/sqsq/"
NODES = ROOT + "nodes/"
MEMBERS = ROOT + "members/"
JOINED = ROOT + "joined/"
SHARDS = ROOT + "shards/"
QUEUES = ROOT + "queues/"
LEADERS = ROOT + "leaders/"
CONTROLLER = ROOT + "controller"

RECORD_KINDS = ("nodes", "members", "shards", "queues", "leaders")  # what the map holds
REPLICATION_FACTOR = 3
MAX_PARTITIONS = 64  # per queue: a bound on fan-out for one long poll


class RecordError(ValueError):
    """A value under /sqsq/ that is not a valid record for its key."""


def node_key(node_id: str) -> str:
    return NODES + _check_id(node_id)


def member_key(node_id: str) -> str:
    return MEMBERS + _check_id(node_id)


def joined_key(shard_id: int, node_id: str) -> str:
    return f"{JOINED}{_check_shard(shard_id)}/{_check_id(node_id)}"


def shard_key(shard_id: int) -> str:
    return SHARDS + str(_check_shard(shard_id))


def queue_key(key: str) -> str:
    region, sep, name = key.partition("/")
    if sep and not regions.valid_region(region):
        raise RecordError(f"not a region: {region!r}")
    _check_id(name if sep else key)
    return QUEUES + key


def leader_key(shard_id: int) -> str:
    return LEADERS + str(_check_shard(shard_id))


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    grpc_address: str  # host:port the gateway and the other nodes call
    raft_address: str  # host:base_port; shard s's Raft group listens on base_port + s
    host: str = ""  # the machine it runs on (``--host-label``); "": its advertised address
    # its event loop near full (``balance.busy_after``): standard queues' sends to the shards
    # it leads spread to more partitions (``sqsq.wire.send_width``)
    busy: bool = False

    @property
    def host_label(self) -> str:
        """The host this node shares with the other nodes of one machine: no two replicas
        of a shard are placed on one (``placement``). By default the address it is reached
        at, which the nodes of one machine share."""
        return self.host or self.grpc_address.rpartition(":")[0]

    def raft_for(self, shard_id: int) -> str:
        host, _, port = self.raft_address.rpartition(":")
        return f"{host}:{int(port) + shard_id}"


@dataclass(frozen=True)
class ShardRecord:
    shard_id: int
    replicas: tuple[str, ...]  # node ids, distinct
    epoch: int  # +1 on every change of the replica set

    def __post_init__(self) -> None:
        if len(set(self.replicas)) != len(self.replicas):
            raise RecordError(f"shard {self.shard_id}: replicas repeat a node: {self.replicas}")

    def with_replicas(self, replicas: tuple[str, ...]) -> ShardRecord:
        """The next version of this record: new replica set, epoch one higher."""
        return ShardRecord(self.shard_id, tuple(replicas), self.epoch + 1)


@dataclass(frozen=True)
class QueueRecord:
    name: str
    queue_id: str
    partitions: tuple[int, ...]  # partition i lives on shard partitions[i]

    def __post_init__(self) -> None:
        if not 1 <= len(self.partitions) <= MAX_PARTITIONS:
            raise RecordError(f"queue {self.name}: {len(self.partitions)} partitions "
                              f"(1..{MAX_PARTITIONS})")


@dataclass(frozen=True)
class LeaderHint:
    shard_id: int
    node_id: str
    term: int  # Raft term the leader was elected in: a newer term's hint supersedes
    epoch: int = 0  # the replica-set epoch the leader's Raft membership has caught up with


Record = NodeRecord | ShardRecord | QueueRecord | LeaderHint


def encode(record: Record) -> bytes:
    if isinstance(record, NodeRecord):
        body: dict[str, Any] = {"node_id": record.node_id, "grpc": record.grpc_address,
                                "raft": record.raft_address,
                                **({"host": record.host} if record.host else {}),
                                **({"busy": True} if record.busy else {})}
    elif isinstance(record, ShardRecord):
        body = {"shard_id": record.shard_id, "replicas": list(record.replicas),
                "epoch": record.epoch}
    elif isinstance(record, QueueRecord):
        body = {"name": record.name, "queue_id": record.queue_id,
                "partitions": list(record.partitions)}
    elif isinstance(record, LeaderHint):
        body = {"shard_id": record.shard_id, "node_id": record.node_id, "term": record.term,
                "epoch": record.epoch}
    else:
        raise TypeError(f"not a record: {record!r}")
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_node(value: bytes) -> NodeRecord:
    body = _load(value)
    return NodeRecord(_get(body, "node_id", str), _get(body, "grpc", str),
                      _get(body, "raft", str), _get(body, "host", str) if "host" in body else "",
                      _get(body, "busy", bool) if "busy" in body else False)


def decode_shard(value: bytes) -> ShardRecord:
    body = _load(value)
    return ShardRecord(_get(body, "shard_id", int), _str_tuple(body, "replicas"),
                       _get(body, "epoch", int))


def decode_queue(value: bytes) -> QueueRecord:
    body = _load(value)
    partitions = _get(body, "partitions", list)
    if not all(type(p) is int for p in partitions):
        raise RecordError(f"partitions must be shard ids: {partitions!r}")
    return QueueRecord(_get(body, "name", str), _get(body, "queue_id", str), tuple(partitions))


def decode_leader(value: bytes) -> LeaderHint:
    body = _load(value)
    return LeaderHint(_get(body, "shard_id", int), _get(body, "node_id", str),
                      _get(body, "term", int),
                      _get(body, "epoch", int) if "epoch" in body else 0)


def parse_key(key: str) -> tuple[str, str]:
    """('nodes' | 'members' | 'shards' | 'queues' | 'leaders', the id part) of a key under
    /sqsq/."""
    if not key.startswith(ROOT):
        raise RecordError(f"not a sqsq key: {key!r}")
    kind, sep, ident = key[len(ROOT):].partition("/")
    if not sep or kind not in RECORD_KINDS or not ident:
        raise RecordError(f"not a record key: {key!r}")
    return kind, ident


def decode(key: str, value: bytes) -> Record:
    """The record stored at ``key``, checked against the key it is stored under."""
    kind, ident = parse_key(key)
    if kind in ("nodes", "members"):
        node = decode_node(value)
        _same(key, ident, node.node_id)
        return node
    if kind == "shards":
        shard = decode_shard(value)
        _same(key, ident, str(shard.shard_id))
        return shard
    if kind == "queues":
        queue = decode_queue(value)
        _same(key, ident, queue.name)
        return queue
    hint = decode_leader(value)
    _same(key, ident, str(hint.shard_id))
    return hint


def _same(key: str, ident: str, inside: str) -> None:
    if ident != inside:
        raise RecordError(f"{key} holds a record for {inside!r}")


def _load(value: bytes) -> dict[str, Any]:
    try:
        body = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {value[:80]!r}") from exc
    if not isinstance(body, dict):
        raise RecordError(f"not a JSON object: {value[:80]!r}")
    return body


def _get(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    # bool is an int to Python; a true/false where a number belongs is still corrupt.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecordError(f"field {name!r} must be {kind.__name__}, not {value!r}")
    return value


def _str_tuple(body: dict[str, Any], name: str) -> tuple[str, ...]:
    items = _get(body, name, list)
    if not all(isinstance(i, str) for i in items):
        raise RecordError(f"field {name!r} must list strings: {items!r}")
    return tuple(items)


def _check_id(ident: str) -> str:
    if not ident or "/" in ident or len(ident) > 256:
        raise RecordError(f"an id is 1..256 characters without '/': {ident!r}")
    return ident


def _check_shard(shard_id: int) -> int:
    if type(shard_id) is not int or shard_id < 0:
        raise RecordError(f"a shard id is a non-negative int: {shard_id!r}")
    return shard_id
