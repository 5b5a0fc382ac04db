"""An entry's commands applied together (``machine.apply_commands``, as every replica applies
a log entry) write and answer what applying each alone, in turn, does: a run of message
commands shares one state, and whatever else is in the entry sees that run's writes."""

from __future__ import annotations

from coresupport import CONFIG
from sqsq.core import commands as c
from sqsq.core.machine import apply, apply_commands
from sqsq.core.txn import Txn
from sqsq.shard.store import MemoryStore

NOW = 1_700_000_000_000


def _both(setup: list[c.Command], entry: list[c.Command]) -> tuple[list, list]:
    """(outcomes, store contents) of ``entry`` applied command by command, then together."""
    runs = []
    for together in (False, True):
        store = MemoryStore()
        txn = Txn(store)
        for command in setup:
            apply(txn, CONFIG, command, NOW)
        store.write(txn.writes(), sync=False)
        txn = Txn(store)
        outcomes = apply_commands(txn, CONFIG, entry, NOW + 5_000) if together else \
            [apply(txn, CONFIG, command, NOW + 5_000) for command in entry]
        store.write(txn.writes(), sync=False)
        runs.append((outcomes, list(store.scan(b"", b"\xff"))))
    assert runs[0] == runs[1]
    return runs[1]


def _send(queue: str, n: int, first_id: int = 0) -> c.SendMessages:
    return c.SendMessages(queue, tuple(c.SendEntry(str(i), f"body {i}") for i in range(n)), "",
                          tuple(f"m-{first_id + i}" for i in range(n)))


def test_a_sweep_after_a_run_of_message_commands_sees_the_run_s_schedule() -> None:
    """A receive with a zero visibility timeout puts the queue's timer due at once; a Sweep
    later in the same entry finds it there (the run's state is written before the Sweep)."""
    outcomes, _ = _both([c.CreateQueue("q")], [
        _send("q", 3), c.ReceiveMessages("q", 3, 0, nonce=7), c.Sweep(),
        c.ReceiveMessages("q", 3, 30, nonce=8)])
    assert len(outcomes[1].result.messages) == 3
    assert len(outcomes[3].result.messages) == 3  # back, visible, received again


def test_a_queue_changed_in_the_middle_of_an_entry_is_seen_changed() -> None:
    """The record a run of message commands shares is read again after a command that
    changes it: a send after MaximumMessageSize shrank is refused."""
    outcomes, _ = _both([c.CreateQueue("q")], [
        _send("q", 1), c.SetQueueAttributes("q", (("MaximumMessageSize", "1024"),)),
        c.SendMessages("q", (c.SendEntry("1", "x" * 2000),), "", ("m-9",)), _send("q", 1, 10)])
    assert not outcomes[0].result.failed
    assert outcomes[2].result.failed
    assert not outcomes[3].result.failed


def test_a_queue_deleted_or_created_in_the_middle_of_an_entry() -> None:
    outcomes, _ = _both([c.CreateQueue("q")], [
        _send("q", 2), c.DeleteQueue("q"), _send("q", 1, 5), c.CreateQueue("q2"),
        _send("q2", 1, 7), c.ReceiveMessages("q2", 1, 30, nonce=3)])
    assert outcomes[2].result.code.name == "QUEUE_DOES_NOT_EXIST"  # type: ignore[union-attr]
    assert len(outcomes[5].result.messages) == 1
