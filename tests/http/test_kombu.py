"""The real kombu SQS transport and a real Celery worker against ``sqsq server``, unmodified.

kombu (``kombu[sqs]``) speaks AWS JSON 1.0 twice over: through boto3 for publishing, acks,
requeues and kombu's own blocking ``drain_events``, and through its pycurl client, signing
with botocore, for the receives of a Celery worker's event loop. Both reach the server given as
``sqs://KEY:SECRET@HOST:PORT`` with ``is_secure: False``; kombu creates the queues it declares.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from botocore.exceptions import ClientError
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu import Connection, Exchange, Queue
from kombu.asynchronous import set_event_loop

from serverproc import ServerProcess

# kombu's pycurl client still calls pycurl APIs that pycurl 7.49 deprecates (harmless here).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.* is deprecated; use:DeprecationWarning:kombu.asynchronous.http.curl")

# Short long-polls and a short poll interval keep every test to a second or two.
FAST = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1,
        "polling_interval": 0.05}


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not reached within {timeout_s}s")
        time.sleep(0.05)


def counts(sqs: Any, url: str) -> tuple[int, int]:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]))


def broker_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"sqs://x:y@{parts.hostname}:{parts.port}"


@pytest.fixture
def kombu_queue(sqs: Any) -> Iterator[Callable[..., tuple[str, Queue]]]:
    """``kombu_queue(prefix)``: a fresh name and its kombu Queue; the SQS queues kombu creates
    for those names are deleted afterwards."""
    names: list[str] = []

    def make(prefix: str = "kombu", fifo: bool = False) -> tuple[str, Queue]:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
        names.append(name)
        return name, Queue(name, Exchange(name, type="direct"), routing_key=name)

    yield make
    for name in names:
        try:
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except sqs.exceptions.QueueDoesNotExist:
            pass


def drain(conn: Connection, queue: Queue, on_message: Callable[[Any, Any], None],
          done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """kombu's consumer loop: ``drain_events`` until ``done()`` or the deadline."""
    with conn.Consumer([queue], callbacks=[on_message], accept=["json"]):
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() >= deadline:
                raise AssertionError(f"consumer loop did not finish within {timeout_s}s")
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass


def test_kombu_publish_consume_ack_delivers_each_message_once(
        sqs_endpoint: str, sqs: Any, kombu_queue: Any) -> None:
    name, queue = kombu_queue()
    n = 25
    with Connection(broker_url(sqs_endpoint),
                    transport_options={**FAST, "visibility_timeout": 30}) as conn:
        producer = conn.Producer()
        for i in range(n):
            producer.publish({"n": i, "text": f"job {i} é"}, exchange=queue.exchange,
                             routing_key=name, declare=[queue], serializer="json")
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        # kombu created the queue with the visibility timeout it was configured with.
        assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])[
            "Attributes"]["VisibilityTimeout"] == "30"
        assert counts(sqs, url) == (n, 0)

        got: list[dict[str, Any]] = []

        def process(body: Any, message: Any) -> None:
            got.append(body)
            message.ack()  # DeleteMessage with this delivery's receipt handle

        drain(conn, queue, process, lambda: len(got) >= n)
    assert sorted(b["n"] for b in got) == list(range(n))  # each exactly once
    assert all(b["text"] == f"job {b['n']} é" for b in got)
    assert counts(sqs, url) == (0, 0)


def test_kombu_unacked_message_comes_back_after_its_visibility_timeout(
        sqs_endpoint: str, sqs: Any, kombu_queue: Any) -> None:
    name, queue = kombu_queue("kombu-vt")
    with Connection(broker_url(sqs_endpoint),
                    transport_options={**FAST, "visibility_timeout": 1}) as conn:
        conn.Producer().publish({"job": "slow"}, exchange=queue.exchange, routing_key=name,
                                declare=[queue], serializer="json")
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        # When each of kombu's ReceiveMessage requests left it. A visibility timeout starts
        # when the server takes the message, as SQS's does: an answer that reaches the
        # consumer late (a pause of this process, a stalled disk) leaves it less of the
        # timeout, so the timeout is measured from the request, not from the delivery.
        receives_sent: list[float] = []
        conn.default_channel.sqs(name).meta.events.register(
            "before-send.sqs.ReceiveMessage",
            lambda **_: receives_sent.append(time.monotonic()))
        # (when its receive was asked for, when it came, receive count, message)
        deliveries: list[tuple[float, float, str, Any]] = []

        def process(body: Any, message: Any) -> None:
            count = message.delivery_info["sqs_message"]["Attributes"]["ApproximateReceiveCount"]
            deliveries.append((receives_sent[-1], time.monotonic(), count, message))
            # The first delivery "crashes": it is neither acked nor rejected.
            if len(deliveries) == 2:
                message.ack()

        drain(conn, queue, process, lambda: len(deliveries) >= 2)
        (first_asked_at, _, first_count, first), (_, again_at, again_count, again) = deliveries
        assert first.payload == again.payload == {"job": "slow"}
        assert (first_count, again_count) == ("1", "2")
        assert first.delivery_tag != again.delivery_tag  # a new receipt handle
        # Hidden for its 1 s visibility timeout, not less (the log's clock may run 1% fast).
        assert again_at - first_asked_at >= 0.95
        # A late ack of the first delivery uses an expired receipt handle: kombu shrugs it off
        # and the message is not deleted by it (the second delivery already was, above).
        first.ack()
    assert counts(sqs, url) == (0, 0)


def test_kombu_requeue_returns_the_message_and_reject_deletes_it(
        sqs_endpoint: str, sqs: Any, kombu_queue: Any) -> None:
    name, queue = kombu_queue("kombu-rej")
    # A requeue is ChangeMessageVisibility to wait_time_seconds: 0 makes it visible at once.
    options = {**FAST, "wait_time_seconds": 0, "visibility_timeout": 30}
    with Connection(broker_url(sqs_endpoint), transport_options=options) as conn:
        conn.Producer().publish({"job": "flaky"}, exchange=queue.exchange, routing_key=name,
                                declare=[queue], serializer="json")
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        seen: list[str] = []

        def process(body: Any, message: Any) -> None:
            seen.append(message.delivery_info["sqs_message"]["Attributes"][
                "ApproximateReceiveCount"])
            if len(seen) == 1:
                message.requeue()
            else:
                message.reject()  # no dead-letter queue: kombu deletes it

        drain(conn, queue, process, lambda: len(seen) >= 2)
    assert seen == ["1", "2"]
    assert counts(sqs, url) == (0, 0)


def test_kombu_reject_on_a_queue_with_a_redrive_policy_ends_in_the_dead_letter_queue(
        sqs_endpoint: str, sqs: Any, new_queue: Any, kombu_queue: Any) -> None:
    dlq = new_queue("kombu-dlq")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    name, queue = kombu_queue("kombu-src")
    url = sqs.create_queue(QueueName=name, Attributes={
        "VisibilityTimeout": "1",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}),
    })["QueueUrl"]
    with Connection(broker_url(sqs_endpoint), transport_options=FAST) as conn:
        conn.Producer().publish({"job": "poison"}, exchange=queue.exchange, routing_key=name,
                                declare=[queue], serializer="json")
        rejected: list[str] = []

        def process(body: Any, message: Any) -> None:
            rejected.append(body["job"])
            # kombu reads RedrivePolicy and leaves the message to SQS's redrive
            message.reject()

        drain(conn, queue, process, lambda: counts(sqs, dlq)[0] == 1)
    assert rejected == ["poison"]
    (moved,) = sqs.receive_message(QueueUrl=dlq, MessageSystemAttributeNames=["All"])["Messages"]
    assert moved["Attributes"]["DeadLetterQueueSourceArn"].endswith(f":{name}")
    assert counts(sqs, url) == (0, 0)


def test_kombu_fifo_queue_keeps_order(sqs_endpoint: str, sqs: Any, kombu_queue: Any) -> None:
    name, queue = kombu_queue("kombu-fifo", fifo=True)
    n = 15
    with Connection(broker_url(sqs_endpoint), transport_options=FAST) as conn:
        producer = conn.Producer()
        for i in range(n):  # kombu adds MessageGroupId "default" and a deduplication id
            producer.publish({"n": i}, exchange=queue.exchange, routing_key=name,
                             declare=[queue], serializer="json")
        got: list[int] = []

        def process(body: Any, message: Any) -> None:
            got.append(body["n"])
            message.ack()

        drain(conn, queue, process, lambda: len(got) >= n)
    assert got == list(range(n))
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["FifoQueue"])[
        "Attributes"]["FifoQueue"] == "true"
    assert counts(sqs, url) == (0, 0)


def test_kombu_predefined_queue_by_url_with_message_attributes(
        sqs_endpoint: str, sqs: Any, new_queue: Any) -> None:
    # The production setup: queues made beforehand and named by URL, so kombu neither lists
    # nor creates queues; message attributes asked for by name.
    url = new_queue("kombu-pre", VisibilityTimeout="30")
    name = url.rsplit("/", 1)[1]
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    options = {**FAST, "predefined_queues": {name: {"url": url}},
               "fetch_message_attributes": {"MessageAttributeNames": ["tenant"]}}
    with Connection(broker_url(sqs_endpoint), transport_options=options) as conn:
        producer = conn.Producer()
        for i in range(3):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key=name,
                             declare=[queue], serializer="json", message_attributes={
                                 "tenant": {"DataType": "String", "StringValue": f"t{i}"},
                                 "other": {"DataType": "Number", "StringValue": "7"}})
        got: dict[int, Any] = {}

        def process(body: Any, message: Any) -> None:
            got[body["n"]] = message.delivery_info["sqs_message"].get("MessageAttributes")
            message.ack()

        drain(conn, queue, process, lambda: len(got) >= 3)
    assert got == {i: {"tenant": {"DataType": "String", "StringValue": f"t{i}"}}
                   for i in range(3)}
    assert counts(sqs, url) == (0, 0)


# ---- Celery: a worker thread with its kombu event loop (pycurl receives) ----

@contextmanager
def celery_worker(broker: str, sqs: Any,
                  options: dict[str, Any] | None = None) -> Iterator[tuple[dict[str, Any], str]]:
    """A Celery app on ``broker`` with a solo worker thread; yields its tasks and queue name.

    One worker at a time: kombu keeps the worker's event loop in a process-wide global.
    """
    queue_name = f"celery-{uuid.uuid4().hex[:10]}"
    app = Celery("sqsq_kombu_test", broker=broker, backend="cache+memory://",
                 set_as_current=False)
    app.conf.update(
        broker_transport_options={**FAST, "visibility_timeout": 30, **(options or {})},
        task_default_queue=queue_name,
        broker_connection_retry_on_startup=False,
        worker_hijack_root_logger=False,
    )
    calls: list[tuple[int, int]] = []
    attempts: dict[str, int] = {}

    @app.task(name=f"{queue_name}.add")
    def add(x: int, y: int) -> int:
        calls.append((x, y))
        return x + y

    @app.task(name=f"{queue_name}.flaky", bind=True, max_retries=3)
    def flaky(self: Any, key: str) -> str:
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] < 2:
            raise self.retry(countdown=0)  # republished, then run again by the worker
        return f"{key} after {attempts[key]} attempts"

    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=15):
            yield {"add": add, "flaky": flaky, "calls": calls}, queue_name
    finally:
        set_event_loop(None)  # the stopped worker's hub must not serve later kombu connections
        try:
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=queue_name)["QueueUrl"])
        except sqs.exceptions.QueueDoesNotExist:
            pass


def test_celery_worker_runs_delayed_tasks_once_and_deletes_them(
        sqs_endpoint: str, sqs: Any) -> None:
    with celery_worker(broker_url(sqs_endpoint), sqs) as (tasks, queue_name):
        assert tasks["add"].delay(2, 3).get(timeout=20) == 5
        results = [tasks["add"].delay(i, i) for i in range(10)]
        assert [r.get(timeout=20) for r in results] == [2 * i for i in range(10)]
        # each ran exactly once
        assert sorted(tasks["calls"]) == sorted([(2, 3)] + [(i, i) for i in range(10)])
        url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
        wait_for(lambda: counts(sqs, url) == (0, 0))  # every task message was deleted


def test_celery_task_retry_is_republished_and_succeeds(sqs_endpoint: str, sqs: Any) -> None:
    with celery_worker(broker_url(sqs_endpoint), sqs) as (tasks, queue_name):
        assert tasks["flaky"].delay("k1").get(timeout=20) == "k1 after 2 attempts"
        url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
        wait_for(lambda: counts(sqs, url) == (0, 0))


def test_celery_worker_fetching_all_message_attributes(sqs_endpoint: str, sqs: Any) -> None:
    # kombu sends ["All"] as "ALL" on both attribute lists; SQS (and sqsq) take it.
    with celery_worker(broker_url(sqs_endpoint), sqs,
                       {"fetch_message_attributes": ["All"]}) as (tasks, _):
        assert tasks["add"].delay(20, 22).get(timeout=20) == 42


# ---- with authentication on: boto3 and kombu's own pycurl requests are SigV4-signed ----

KEY, SECRET = "AKIDKOMBU", "kombu/secret+key"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("kombu-locked")
    srv = ServerProcess(root / "data", env={
        "SQSQ_ACCESS_KEY_ID": KEY, "SQSQ_SECRET_ACCESS_KEY": SECRET}).start()
    yield srv
    srv.stop()


def signed_broker_url(endpoint: str, key: str, secret: str) -> str:
    parts = urlsplit(endpoint)
    return f"sqs://{quote(key, safe='')}:{quote(secret, safe='')}@{parts.hostname}:{parts.port}"


def test_celery_and_kombu_with_sigv4_credentials(locked: ServerProcess,
                                                 client_for: Any) -> None:
    sqs = client_for(locked.http_url, KEY, SECRET)
    with celery_worker(signed_broker_url(locked.http_url, KEY, SECRET), sqs) as (tasks, name):
        assert [tasks["add"].delay(i, 1).get(timeout=20) for i in range(3)] == [1, 2, 3]
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        wait_for(lambda: counts(sqs, url) == (0, 0))
    # A wrong secret is refused at the first request kombu makes, not silently retried.
    bad = Connection(signed_broker_url(locked.http_url, KEY, "wrong"), transport_options=FAST)
    with pytest.raises(ClientError) as e:
        bad.default_channel  # noqa: B018 - opening the channel lists the queues
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    bad.release()
