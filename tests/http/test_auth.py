"""Authentication: with credentials configured, HTTP needs SigV4 and gRPC a signed token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.auth
import grpc
import pytest
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from serverproc import ServerProcess
from sqsq.gateway.auth import grpc_token
from sqsq.v1 import queues_pb2 as pb
from sqsq.v1 import queues_pb2_grpc as pb_grpc

FILE_KEY, FILE_SECRET = "AKIDFILE", "file-secret"
ENV_KEY, ENV_SECRET = "AKIDENV", "env-secret"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("locked")
    creds = root / "credentials"
    creds.write_text(f"# key id and secret\n{FILE_KEY} {FILE_SECRET}\n")
    srv = ServerProcess(root / "data", env={
        "SQSQ_CREDENTIALS_FILE": str(creds),
        "SQSQ_ACCESS_KEY_ID": ENV_KEY, "SQSQ_SECRET_ACCESS_KEY": ENV_SECRET}).start()
    yield srv
    srv.stop()


def test_startup_says_whether_auth_is_on(locked: ServerProcess, server: ServerProcess) -> None:
    assert "authentication ON (2 access key(s))" in locked.log_text()
    assert "authentication is OFF" in server.log_text()


def test_valid_signatures_from_file_and_env(locked: ServerProcess, client_for: Any) -> None:
    for key, secret in ((FILE_KEY, FILE_SECRET), (ENV_KEY, ENV_SECRET)):
        sqs = client_for(locked.http_url, key, secret)
        url = sqs.create_queue(QueueName=f"auth-{key.lower()}")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="signed")
        assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "signed"


def test_wrong_secret_and_unknown_key_rejected(locked: ServerProcess, client_for: Any) -> None:
    bad = client_for(locked.http_url, FILE_KEY, "wrong-secret")
    with pytest.raises(bad.exceptions.ClientError) as e:
        bad.list_queues()
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    unknown = client_for(locked.http_url, "AKIDNOBODY", FILE_SECRET)
    with pytest.raises(unknown.exceptions.ClientError) as e:
        unknown.list_queues()
    assert e.value.response["Error"]["Code"] == "InvalidClientTokenId"


def test_unsigned_request_rejected(locked: ServerProcess) -> None:
    req = urllib.request.Request(
        locked.http_url + "/", data=json.dumps({}).encode(), method="POST",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                 "Content-Type": "application/x-amz-json-1.0"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403
    assert e.value.headers["x-amzn-query-error"] == "MissingAuthenticationToken;Sender"


def test_query_protocol_signed_and_tampered(locked: ServerProcess, query_client: Any) -> None:
    query, text, NS = query_client
    status, root = query(locked.http_url, {"Action": "ListQueues"}, FILE_KEY, FILE_SECRET)
    assert status == 200
    status, root = query(locked.http_url, {"Action": "ListQueues"}, FILE_KEY, "nope")
    assert status == 403 and text(root, "sqs:Error/sqs:Code") == "SignatureDoesNotMatch"
    assert root.tag == f"{{{NS['sqs']}}}ErrorResponse"


def test_grpc_needs_a_valid_token(locked: ServerProcess) -> None:
    method = "/sqsq.v1.Queues/ListQueues"
    with grpc.insecure_channel(locked.endpoint) as channel:
        stub = pb_grpc.QueuesStub(channel)
        stub.ListQueues(pb.ListQueuesRequest(), timeout=10, metadata=(
            ("authorization", grpc_token(FILE_KEY, FILE_SECRET, method)),))
        cases = [
            ((), "MissingAuthenticationToken"),
            ((("authorization", grpc_token(FILE_KEY, "wrong", method)),),
             "SignatureDoesNotMatch"),
            ((("authorization", grpc_token("AKIDNOBODY", "x", method)),), "InvalidClientTokenId"),
            # A token signed for another method does not open this one.
            ((("authorization", grpc_token(FILE_KEY, FILE_SECRET,
                                           "/sqsq.v1.Queues/DeleteQueue")),),
             "SignatureDoesNotMatch"),
        ]
        for metadata, code in cases:
            with pytest.raises(grpc.RpcError) as e:
                stub.ListQueues(pb.ListQueuesRequest(), timeout=10, metadata=metadata)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert dict(e.value.trailing_metadata())["sqs-error-code"] == code


def test_credentials_file_in_aws_ini_format(tmp_path: Path, client_for: Any) -> None:
    creds = tmp_path / "aws-credentials"
    creds.write_text("[default]\naws_access_key_id = AKIDINI\naws_secret_access_key = ini-s\n")
    srv = ServerProcess(tmp_path / "data", env={"SQSQ_CREDENTIALS_FILE": str(creds)}).start()
    try:
        assert client_for(srv.http_url, "AKIDINI", "ini-s").list_queues()[
            "ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        srv.stop()


def test_sdk_clients_sign_grpc_calls(locked: ServerProcess) -> None:
    import asyncio

    from sqsq.client import AsyncClient, Client
    from sqsq.errors import QueueError

    with Client(locked.endpoint, credentials=(ENV_KEY, ENV_SECRET)) as c:
        url = c.create_queue("sdk-signed")
        c.send_message(url, "via grpc")
    with Client(locked.endpoint, credentials=(ENV_KEY, "wrong")) as c:
        with pytest.raises(QueueError) as e:
            c.list_queues()
        assert e.value.code == "SignatureDoesNotMatch"

    async def run() -> list[str]:
        async with AsyncClient(locked.endpoint, credentials=(FILE_KEY, FILE_SECRET)) as c:
            return [m.body for m in await c.receive_message("sdk-signed", wait_time_seconds=1)]

    assert asyncio.run(run()) == ["via grpc"]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_presigned_url(locked: ServerProcess, client_for: Any,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A presigned query-protocol GET: the signature rides in the URL, for its X-Amz-Expires."""
    sqs = client_for(locked.http_url, FILE_KEY, FILE_SECRET)
    queue_url = sqs.create_queue(QueueName="presigned")["QueueUrl"]

    def presign(secret: str = FILE_SECRET, hours_ago: int = 0) -> str:
        req = AWSRequest(method="GET", url=f"{queue_url}?Action=SendMessage"
                         "&MessageBody=from%20a%20link&Version=2012-11-05")
        signed_at = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=hours_ago)
        with monkeypatch.context() as patched:  # botocore's signing clock, for this URL only
            patched.setattr(botocore.auth, "get_current_datetime", lambda: signed_at)
            SigV4QueryAuth(Credentials(FILE_KEY, secret), "sqs", "us-east-1", expires=60) \
                .add_auth(req)
        return req.prepare().url

    status, body = _get(presign())
    assert status == 200 and b"<MessageId>" in body
    status, body = _get(presign(secret="wrong"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    status, body = _get(presign(hours_ago=2))  # valid for 60 s, two hours ago
    assert status == 403 and b"<Code>AccessDenied</Code>" in body
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in got] == ["from a link"]  # only the valid link sent


def test_gateway_without_keys_passes_on_the_nodes_403(
        locked: ServerProcess, tmp_path: Path, client_for: Any) -> None:
    """A gateway run without credentials in front of a locked node: every call fails, with
    the node's own error and status (403), not an HTTP 500."""
    from serverproc import GatewayProcess

    gw = GatewayProcess(tmp_path / "gw", backend=locked.endpoint).start()
    try:
        sqs = client_for(gw.http_url)
        with pytest.raises(sqs.exceptions.ClientError) as e:
            sqs.list_queues()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert e.value.response["Error"]["Code"] == "MissingAuthenticationToken"
    finally:
        gw.stop()
