"""Which failed calls the SDK (and the gateway, which uses it) tries again."""

from __future__ import annotations

from types import SimpleNamespace

import grpc

from sqsq.client import _call, _ops, batchcalls


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


OUTCOME_UNKNOWN = FakeError(
    grpc.StatusCode.UNAVAILABLE,
    "The outcome is unknown: the shard's leader changed. Retry the request.")


def test_deletes_and_receives_are_made_again_on_an_unknown_outcome_visibility_changes_not(
        ) -> None:
    # Deleting again changes nothing whatever the first attempt did: a message already gone
    # deletes again successfully, a superseded handle is refused either way. Receiving again
    # leaves what a lost receive took hidden for its visibility timeout, as an error would. A
    # visibility change made again would hide the message from a later moment, or, were the
    # message received again meanwhile, answer "expired" for a change that was made.
    again = (_ops.delete_message("q", "h"),
             _ops.delete_message_batch("q", [{"Id": "0", "ReceiptHandle": "h"}]),
             batchcalls._delete_batch("q", [SimpleNamespace(receipt_handle="h")]),
             _ops.receive_message("q", 10, wait_time_seconds=20))
    for call in again:
        assert _call.may_retry(call, OUTCOME_UNKNOWN), call.method
    assert not _call.may_retry(_ops.change_message_visibility("q", "h", 5), OUTCOME_UNKNOWN)
