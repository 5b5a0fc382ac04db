"""Which failed calls the SDK (and the gateway, which uses it) tries again."""

from __future__ import annotations

import grpc

from sqsq.client import _call, _ops


class FakeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


NO_CONNECTION = FakeError(grpc.StatusCode.UNAVAILABLE,
                          "failed to connect to all addresses; last error: Connection refused")
DROPPED = FakeError(grpc.StatusCode.UNAVAILABLE, "Socket closed")


def test_a_call_that_never_left_is_retried_whatever_it_is() -> None:
    once = _ops.delete_queue("q")  # not safe to repeat once the server may have applied it
    assert not once.retry
    assert _call.may_retry(once, NO_CONNECTION)
    assert not _call.may_retry(once, DROPPED)


def test_safe_calls_are_retried_on_any_unavailable_and_nothing_else_is() -> None:
    read = _ops.get_queue_url("q")
    assert _call.may_retry(read, DROPPED) and _call.may_retry(read, NO_CONNECTION)
    assert not _call.may_retry(read, FakeError(grpc.StatusCode.NOT_FOUND, "no such queue"))
