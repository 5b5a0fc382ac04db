"""``sqsq gateway`` as a process of its own: both doors forward to the node, the gateway holds
nothing (a restart loses nothing), a node that is down is retried and then reported, and
authentication holds at the gateway and between gateway and node. (Every test in this
directory also runs through a gateway: see ``sqs_endpoint``.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serverproc import GatewayProcess, ServerProcess
from sqsq.client import Client
from sqsq.errors import QueueDoesNotExist, QueueError
from sqswire import Failed, Wire

KEY, SECRET = "AKIDGATEWAY", "gateway-secret"


@pytest.fixture
def gateway_for(tmp_path: Path) -> Iterator[Any]:
    """``gateway_for(node, env=None)``: a gateway of the test's own, stopped at the end."""
    started: list[GatewayProcess] = []

    def start(node: ServerProcess, env: dict[str, str] | None = None) -> GatewayProcess:
        gw = GatewayProcess(tmp_path / f"gateway-{len(started)}", backend=node.endpoint,
                            env=env or {}).start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


def test_sdk_over_the_gateways_grpc_door(gateway: GatewayProcess) -> None:
    with Client(gateway.endpoint) as client:
        url = client.create_queue(f"gw-{uuid.uuid4().hex[:8]}")
        assert url.startswith(gateway.http_url + "/000000000000/")  # the gateway's own URLs
        sent = client.send_message(url, "through", message_attributes={
            "k": {"DataType": "String", "StringValue": "v"}})
        (m,) = client.receive_message(url, attribute_names=["All"],
                                      message_attribute_names=["All"])
        assert (m.message_id, m.body, m.receive_count) == (sent.message_id, "through", 1)
        assert m.md5_of_message_attributes == sent.md5_of_message_attributes
        client.delete_message(url, m.receipt_handle)
        with pytest.raises(QueueDoesNotExist):
            client.get_queue_url("no-such-queue-here")
        client.delete_queue(url)


def test_restarting_the_gateway_loses_nothing(server: ServerProcess, gateway_for: Any,
                                              client_for: Any) -> None:
    first = gateway_for(server)
    sqs = client_for(first.http_url)
    name = f"gw-restart-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for i in range(5):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    first.kill9()
    second = gateway_for(server)
    sqs2 = client_for(second.http_url)
    url2 = sqs2.get_queue_url(QueueName=name)["QueueUrl"]
    got = []
    while len(got) < 5:
        batch = sqs2.receive_message(QueueUrl=url2, MaxNumberOfMessages=10,
                                     WaitTimeSeconds=1).get("Messages", [])
        assert batch, f"only {sorted(got)} came back"
        got += [m["Body"] for m in batch]
        sqs2.delete_message_batch(QueueUrl=url2, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)])
    assert sorted(got) == [f"m{i}" for i in range(5)]
    sqs2.delete_queue(QueueUrl=url2)


def test_a_node_that_is_down_is_retried_then_reported(fresh_server: ServerProcess,
                                                      gateway_for: Any,
                                                      client_for: Any) -> None:
    gw = gateway_for(fresh_server)
    sqs = client_for(gw.http_url)
    url = sqs.create_queue(QueueName="gw-outage")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    fresh_server.stop()
    with pytest.raises(sqs.exceptions.ClientError) as e:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert e.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    fresh_server.start()  # the same data and ports: the gateway carries on by itself
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "kept"


def test_authentication_at_the_gateway_and_to_the_node(tmp_path: Path, gateway_for: Any,
                                                       client_for: Any) -> None:
    env = {"SQSQ_ACCESS_KEY_ID": KEY, "SQSQ_SECRET_ACCESS_KEY": SECRET}
    node = ServerProcess(tmp_path / "node", env=env).start()
    try:
        gw = gateway_for(node, env=env)  # checks clients, and signs its own calls to the node
        # The banner follows the ports being open (what start() waits for): look until it is
        # written, within a bound.
        deadline = time.monotonic() + 30
        while "authentication ON" not in gw.log_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "authentication ON" in gw.log_text()
        sqs = client_for(gw.http_url, KEY, SECRET)
        url = sqs.create_queue(QueueName="gw-locked")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="signed twice")
        assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "signed twice"
        bad = client_for(gw.http_url, KEY, "wrong")
        with pytest.raises(bad.exceptions.ClientError) as e:
            bad.list_queues()
        assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    finally:
        node.stop()


def test_a_gateway_without_keys_before_a_locked_node_says_so(tmp_path: Path, gateway_for: Any,
                                                             client_for: Any) -> None:
    """The node refuses it: one line at start-up says so, and every call, through either
    door and protocol, gets the node's own 403 error, as SQS answers an unsigned caller."""
    node = ServerProcess(tmp_path / "node", env={"SQSQ_ACCESS_KEY_ID": KEY,
                                                 "SQSQ_SECRET_ACCESS_KEY": SECRET}).start()
    try:
        open_gw = gateway_for(node, env={"SQSQ_ACCESS_KEY_ID": "", "SQSQ_SECRET_ACCESS_KEY": ""})
        deadline = time.monotonic() + 10
        while "refuses this gateway's calls" not in open_gw.log_text():
            assert time.monotonic() < deadline, open_gw.log_text()
            time.sleep(0.1)  # the start-up probe runs in the background
        refused = "MissingAuthenticationToken"
        for protocol in ("json", "query"):
            with pytest.raises(Failed) as e:
                Wire(protocol, open_gw.http_url, client_for(open_gw.http_url))(
                    "CreateQueue", QueueName="gw-refused")
            assert (e.value.status, e.value.code) == (403, refused), (protocol, e.value.message)
            assert e.value.message == "Request is missing Authentication Token"
        with Client(open_gw.endpoint) as sdk, pytest.raises(QueueError) as err:
            sdk.list_queues()
        assert err.value.code == refused
        lines = [line for line in open_gw.log_text().splitlines() if refused in line]
        assert len(lines) == 1, lines  # said once, not per call
        assert "SQSQ_ACCESS_KEY_ID" in lines[0]
    finally:
        node.stop()
