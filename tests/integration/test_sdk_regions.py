"""Regions through the SDK (gRPC): ``Client(region=...)`` names the caller's region (metadata
``sqsq-region``); without one, calls are in the server's configured region (us-east-1)."""

from __future__ import annotations

import uuid

import pytest

from serverproc import ServerProcess
from sqsq.client import Client
from sqsq.errors import InvalidParameterValue


def test_a_client_in_another_region_has_queues_of_its_own(door: ServerProcess) -> None:
    with Client(door.endpoint) as home, Client(door.endpoint, region="eu-west-1") as other:
        name = f"region-{uuid.uuid4().hex[:12]}"
        home_url, other_url = home.create_queue(name), other.create_queue(name)
        try:
            assert home_url.endswith(f"/000000000000/{name}")
            assert other_url.endswith(f"/eu-west-1/000000000000/{name}")
            assert other.get_queue_attributes(name, ["QueueArn"])["QueueArn"] == \
                f"arn:aws:sqs:eu-west-1:000000000000:{name}"
            assert home.list_queues(name) == [home_url]
            assert other.list_queues(name) == [other_url]
            other.send_message(name, "by name")  # a bare name: the client's region
            home.send_message(other_url, "by URL")  # a URL naming a region: that region
            assert home.receive_message(home_url) == []
            got = other.receive_message(other_url, max_number_of_messages=10)
            assert sorted(m.body for m in got) == ["by URL", "by name"]
        finally:
            home.delete_queue(home_url)
            other.delete_queue(other_url)


def test_a_region_that_is_no_region_name_is_refused(door: ServerProcess) -> None:
    with Client(door.endpoint, region="Not_A_Region") as client, \
            pytest.raises(InvalidParameterValue):
        client.list_queues()
