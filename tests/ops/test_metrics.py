"""Each process's /metrics after a known workload, parsed with Prometheus' own text parser:
queue depths, request and error counts, latency histograms, Raft state and leader flags."""

from __future__ import annotations

import json
import urllib.request

import pytest

from ops.opssupport import scrape, until
from serverproc import ServerProcess
from sqsq.client import Client


def _http_json(url: str, action: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_metrics_match_the_workload(metered: ServerProcess) -> None:
    url = metered.metrics_url  # type: ignore[attr-defined]
    b = scrape(url)  # the server is shared with other tests here: counts are differences
    with Client(metered.endpoint) as client:
        q = client.create_queue("metered-q")
        for i in range(5):
            client.send_message(q, f"m{i}")
        client.send_message(q, "later", delay_seconds=600)
        received = client.receive_message(q, max_number_of_messages=2, visibility_timeout=600)
        assert len(received) == 2
        with pytest.raises(Exception, match="QueueDoesNotExist"):
            client.send_message("no-such-queue", "x")
    status, _ = _http_json(metered.http_url, "GetQueueUrl", {"QueueName": "metered-q"})
    assert status == 200
    status, _ = _http_json(metered.http_url, "GetQueueUrl", {"QueueName": "nope"})
    assert status == 400

    m = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return m.value(name, 0.0, **labels) - b.value(name, 0.0, **labels)

    # Depths: 5 sent, 2 of them received, 1 delayed.
    assert m.value("sqsq_queue_messages", queue="metered-q", shard="0", state="visible") == 3
    assert m.value("sqsq_queue_messages", queue="metered-q", shard="0", state="in_flight") == 2
    assert m.value("sqsq_queue_messages", queue="metered-q", shard="0", state="delayed") == 1
    age = m.value("sqsq_queue_oldest_message_age_seconds", queue="metered-q", shard="0")
    assert 0 <= age < 120
    # Requests by action and protocol, errors by SQS code, one latency sample each.
    assert delta("sqsq_requests_total", action="SendMessage", protocol="grpc") == 7
    assert delta("sqsq_request_errors_total", action="SendMessage",
                   code="QueueDoesNotExist") == 1
    assert delta("sqsq_requests_total", action="ReceiveMessage", protocol="grpc") == 1
    assert delta("sqsq_requests_total", action="GetQueueUrl", protocol="http") == 2
    assert delta("sqsq_request_errors_total", action="GetQueueUrl",
                   code="QueueDoesNotExist") == 1
    assert delta("sqsq_request_duration_seconds_count", action="SendMessage") == 7
    assert delta("sqsq_request_duration_seconds_bucket", action="SendMessage",
                   le="+Inf") == 7
    assert m.value("sqsq_requests_in_progress", action="SendMessage") == 0
    # The one replica leads, has applied what it committed, fsynced and group-committed.
    assert m.value("sqsq_raft_leader", shard="0") == 1
    assert m.value("sqsq_raft_term", shard="0") >= 1
    commit = m.value("sqsq_raft_commit_index", shard="0")
    assert commit >= b.value("sqsq_raft_commit_index", shard="0") + 2
    assert m.value("sqsq_raft_applied_index", shard="0") == commit
    assert delta("sqsq_raft_fsync_duration_seconds_count", shard="0") >= 1
    # Every command went into some entry: at least 8 (create, 6 sends, receive); the failed
    # send never reached the log, and sweeps may add their own.
    assert delta("sqsq_raft_group_commit_commands_sum", shard="0") >= 8
    assert m.value("sqsq_raft_snapshots_total", shard="0") == 0
    # A leader runs every entry's commands itself; a group of one has no write sets to write.
    assert delta("sqsq_raft_entries_applied_total", shard="0", by="commands") >= 2
    assert m.value("sqsq_raft_entries_applied_total", shard="0", by="write_set") == 0


def test_a_long_poll_is_counted_while_parked(metered: ServerProcess) -> None:
    import threading

    url = metered.metrics_url  # type: ignore[attr-defined]
    with Client(metered.endpoint) as client:
        q = client.create_queue("metered-poll")
        poll = threading.Thread(target=client.receive_message, args=(q,),
                                kwargs={"wait_time_seconds": 20})
        poll.start()
        until("a parked poll", lambda: scrape(url).value("sqsq_long_polls_parked",
                                                         shard="0") == 1)
        assert scrape(url).value("sqsq_requests_in_progress", action="ReceiveMessage") == 1
        client.send_message(q, "wake")
        poll.join(timeout=20)
        assert not poll.is_alive()
    assert scrape(url).value("sqsq_long_polls_parked", shard="0") == 0


def test_cluster_metrics_match_the_workload(cluster) -> None:  # noqa: ANN001 - the suite's
    c = cluster.cluster
    nodes = c.nodes
    gateway = c.gateway.metrics_url
    before = scrape(gateway)
    sent_before = before.value("sqsq_requests_total", 0.0, action="SendMessage",
                               protocol="grpc")
    # Through the gateway (not straight to the shard leaders): its counters are the subject.
    with Client(c.gateway.endpoint, direct=False) as client:
        q = client.create_queue("metered-cluster")
        for i in range(4):
            client.send_message(q, f"m{i}")
        assert len(client.receive_message(q, max_number_of_messages=1,
                                          visibility_timeout=600)) == 1
    after = scrape(gateway)
    assert after.value("sqsq_requests_total", action="SendMessage", protocol="grpc") == \
        sent_before + 4
    scrapes = [scrape(n.metrics_url) for n in nodes]
    # Exactly one leader per shard across the nodes; every replica knows one.
    for shard in range(c.shards):
        flags = [s.value("sqsq_raft_leader", 0.0, shard=str(shard)) for s in scrapes]
        assert sorted(flags) == [0, 0, 1], (shard, flags)
        assert all(s.value("sqsq_raft_leader_known", shard=str(shard)) == 1 for s in scrapes)
        terms = {s.value("sqsq_raft_term", shard=str(shard)) for s in scrapes}
        assert len(terms) == 1, terms
    # Depths are reported by leaders only: summed over the nodes, the queue holds what was
    # sent (one partition: the gateway's default).
    def total(state: str) -> float:
        return sum(sum(s.where("sqsq_queue_messages", queue="metered-cluster",
                               state=state).values()) for s in scrapes)

    assert (total("visible"), total("in_flight"), total("delayed")) == (3, 1, 0)
    # The nodes served the gateway's calls to the shards (passed on as they came, or as
    # batches of the gateway's).
    assert sum(sum(s.where("sqsq_requests_total", action=action).values())
               for s in scrapes for action in ("SendMessage", "SendMessageBatch")) >= 4

