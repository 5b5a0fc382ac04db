"""Fixtures of the integration suite: an SDK client on the shared server and fresh queues.

Every test makes its own uniquely named queues (``make_queue``), so tests never see each
other's messages on the one shared ``server``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from serverproc import DOORS, ServerProcess
from sqsq.client import Client, Message

# The credentials of the ``locked`` server (authentication on).
KEY, SECRET = "AKIDLOCKED", "locked-secret"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of the module's own that requires signed calls (``KEY``, ``SECRET``)."""
    srv = ServerProcess(tmp_path_factory.mktemp("locked") / "data",
                        env={"SQSQ_ACCESS_KEY_ID": KEY, "SQSQ_SECRET_ACCESS_KEY": SECRET})
    yield srv.start()
    srv.stop()


def unique_name(prefix: str = "it") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=DOORS)
def door(request: pytest.FixtureRequest) -> ServerProcess:
    """Where clients connect: the shared server itself, and again a gateway in front of it."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def client(door: ServerProcess) -> Iterator[Client]:
    with Client(door.endpoint, timeout=30) as c:
        yield c


@pytest.fixture
def make_queue(client: Client) -> Callable[..., str]:
    """``make_queue(prefix="it", attributes=None, fifo=False)``: a new queue's URL."""

    def make(prefix: str = "it", attributes: dict[str, str] | None = None,
             fifo: bool = False) -> str:
        name = unique_name(prefix)
        attrs = dict(attributes or {})
        if fifo:
            name += ".fifo"
            attrs.setdefault("FifoQueue", "true")
        return client.create_queue(name, attributes=attrs or None)

    return make


def _depth(client: Client, url: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed) as the queue reports them."""
    a = client.get_queue_attributes(url, ["All"])
    return (
        int(a["ApproximateNumberOfMessages"]),
        int(a["ApproximateNumberOfMessagesNotVisible"]),
        int(a["ApproximateNumberOfMessagesDelayed"]),
    )


def _receive_all(client: Client, url: str, expected: int, *, visibility_timeout: int = 30,
                rounds: int = 50) -> list[Message]:
    """Receive until ``expected`` messages came (or a round comes back empty)."""
    got: list[Message] = []
    for _ in range(rounds):
        if len(got) >= expected:
            break
        batch = client.receive_message(
            url, max_number_of_messages=10, visibility_timeout=visibility_timeout,
            wait_time_seconds=0, attribute_names=["All"], message_attribute_names=["All"],
        )
        if not batch:
            break
        got.extend(batch)
    return got


def _assert_untouched(client: Client, url: str, sent: dict[str, str]) -> None:
    """The queue still holds exactly the ``sent`` messages (id -> body), all receivable."""
    assert _depth(client, url) == (len(sent), 0, 0)
    got = _receive_all(client, url, len(sent))
    assert {m.message_id: m.body for m in got} == sent
    assert len(got) == len(sent)


# The helpers as fixtures: test modules cannot import this conftest by name.
@pytest.fixture
def depth() -> Callable[[Client, str], tuple[int, int, int]]:
    return _depth


@pytest.fixture
def receive_all() -> Callable[..., list[Message]]:
    return _receive_all


@pytest.fixture
def assert_untouched() -> Callable[[Client, str, dict[str, str]], None]:
    return _assert_untouched
