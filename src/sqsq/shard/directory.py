"""The shard services a node hosts, and which one a call is for.

A node holds a replica of several shards; the gateway names the shard in each call's
metadata (``SHARD_METADATA_KEY``). A call for a shard this node does not hold is answered
NotLeader without a hint: the caller tries the shard's other replicas.
"""

from __future__ import annotations

from typing import Any

from sqsq.api import SHARD_METADATA_KEY
from sqsq.errors import ErrorCode, from_rejection, not_leader_message, reject
from sqsq.shard.service import ShardService


class ShardDirectory:
    def __init__(self) -> None:
        self.services: dict[int, ShardService] = {}

    def add(self, shard_id: int, service: ShardService) -> None:
        self.services[shard_id] = service

    def remove(self, shard_id: int) -> ShardService | None:
        return self.services.pop(shard_id, None)

    def select(self, context: Any) -> ShardService:
        """The service for the shard a call names (shard 0 when it names none)."""
        shard_id = 0
        for key, value in context.invocation_metadata() or ():
            if key == SHARD_METADATA_KEY:
                try:
                    shard_id = int(value)
                except ValueError:
                    raise from_rejection(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                                                f"{SHARD_METADATA_KEY} is a shard id, not "
                                                f"{value!r}")) from None
        service = self.services.get(shard_id)
        if service is None:
            raise from_rejection(reject(ErrorCode.NOT_LEADER, not_leader_message(None)))
        return service
