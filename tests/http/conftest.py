"""Fixtures for the SQS HTTP API tests: an endpoint URL and unmodified boto3 clients for it.

Every test talks to ``sqs_endpoint`` only, which is the server's own HTTP front and, again,
a ``sqsq gateway`` in front of it: the same tests for both doors.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from serverproc import DOORS
from sqswire import NS, Wire, signed_query, xml_text

ACCESS_KEY = "AKIDSQSQTEST"
SECRET_KEY = "s3cr3t-for-tests"


@pytest.fixture(scope="session", params=DOORS)
def sqs_endpoint(request: pytest.FixtureRequest) -> str:
    """The HTTP endpoint under test: every test runs against the single-node server's own
    HTTP front, and again through a gateway process in front of that server."""
    return request.getfixturevalue(request.param).http_url


def make_client(endpoint: str, key: str = "x", secret: str = "y", region: str = "us-east-1",
                **config: Any) -> Any:
    """A boto3 SQS client signing for ``region`` (``signature_version=UNSIGNED``: unsigned)."""
    return boto3.client(
        "sqs", endpoint_url=endpoint, region_name=region, aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, read_timeout=30, **config))


@pytest.fixture(scope="session")
def sqs(sqs_endpoint: str) -> Any:
    return make_client(sqs_endpoint)


@pytest.fixture
def new_queue(sqs: Any) -> Iterator[Callable[..., str]]:
    """Create a uniquely named queue (``fifo=True`` for FIFO); all deleted afterwards."""
    urls: list[str] = []

    def create(prefix: str = "q", fifo: bool = False, **attributes: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
        if fifo:
            attributes.setdefault("FifoQueue", "true")
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        urls.append(url)
        return url

    yield create
    for url in urls:
        try:
            sqs.delete_queue(QueueUrl=url)
        except sqs.exceptions.QueueDoesNotExist:
            pass


def md5_of_attributes(attrs: dict[str, dict[str, Any]]) -> str:
    """SQS's documented MD5 of message attributes, computed here independently of the server."""
    out = b""

    def field(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    for name in sorted(attrs):
        value = attrs[name]
        out += field(name.encode()) + field(value["DataType"].encode())
        if "StringValue" in value:
            out += b"\x01" + field(value["StringValue"].encode())
        else:
            out += b"\x02" + field(value["BinaryValue"])
    return hashlib.md5(out).hexdigest()


@pytest.fixture(scope="session")
def attributes_md5() -> Callable[[dict[str, dict[str, Any]]], str]:
    return md5_of_attributes


@pytest.fixture(scope="session")
def client_for() -> Callable[..., Any]:
    """``client_for(endpoint, key, secret, region=...)``: a boto3 SQS client with those
    credentials."""
    return make_client


@pytest.fixture(scope="session")
def query_client() -> Any:
    """(signed_query, xml_text, namespaces) for raw query-protocol requests."""
    return signed_query, xml_text, NS


@pytest.fixture(params=["json", "query"])
def wire(request: pytest.FixtureRequest, sqs_endpoint: str, sqs: Any) -> Wire:
    return Wire(request.param, sqs_endpoint, sqs)


@pytest.fixture
def wire_in(wire: Wire) -> Callable[[str | None], Wire]:
    """``wire_in(region)``: the test's protocol and door, signed for ``region`` (None:
    unsigned)."""
    made: dict[str | None, Wire] = {}

    def make(region: str | None) -> Wire:
        if region not in made:
            config = {} if region else {"signature_version": UNSIGNED}
            sqs = make_client(wire.endpoint, region=region or "us-east-1", **config)
            made[region] = Wire(wire.protocol, wire.endpoint, sqs, region)
        return made[region]

    return make
