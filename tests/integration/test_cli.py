"""The ``sqsq`` command against a real server, run as a subprocess."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid

from serverproc import REPO, ServerProcess, free_port
from sqsq.client import Client


def sqsq(server: ServerProcess, *args: str, check: bool = True,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "--endpoint", server.endpoint, *args],
        capture_output=True, text=True, timeout=60, cwd=REPO, input=stdin,
    )
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_queue_create_send_receive_delete(door: ServerProcess, client: Client) -> None:
    name = unique_name("cli")
    out = sqsq(door, "queue", "create", name, "--attr", "VisibilityTimeout=40").stdout.strip()
    assert out == client.get_queue_url(name)
    assert client.get_queue_attributes(name, ["VisibilityTimeout"]) == {"VisibilityTimeout": "40"}

    message_id = sqsq(door, "send", name, "hello from the shell",
                      "--attr", "color=blue").stdout.strip()
    assert message_id
    listed = sqsq(door, "queue", "list", "--prefix", name).stdout.split()
    assert listed == [out]

    shown = sqsq(door, "queue", "attrs", name)
    assert "ApproximateNumberOfMessages" in shown.stdout
    lines = shown.stdout.splitlines()
    line = next(x for x in lines if x.startswith("ApproximateNumberOfMessages "))
    assert line.split()[-1] == "1"

    received = sqsq(door, "receive", name, "--delete", "--wait", "1")
    assert message_id in received.stdout
    assert "hello from the shell" in received.stdout
    assert "color=blue" in received.stdout
    assert "deleted 1" in received.stderr
    assert client.get_queue_attributes(name, ["ApproximateNumberOfMessages",
                                              "ApproximateNumberOfMessagesNotVisible"]) == {
        "ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}

    empty = sqsq(door, "receive", name)
    assert empty.stdout.strip() == ""
    assert "no messages" in empty.stderr


def test_json_output(door: ServerProcess, client: Client) -> None:
    name = unique_name("clijson")
    created = json.loads(sqsq(door, "--json", "queue", "create", name).stdout)
    assert created == {"QueueUrl": client.get_queue_url(name)}

    sent = json.loads(sqsq(door, "send", name, "json body", "--json").stdout)
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"json body").hexdigest()

    attrs = json.loads(sqsq(door, "--json", "queue", "attrs", name,
                            "--set", "DelaySeconds=0").stdout)["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "1"
    assert all(isinstance(v, str) for v in attrs.values())

    listed = json.loads(sqsq(door, "--json", "queue", "list", "--prefix", name).stdout)
    assert listed == {"QueueUrls": [created["QueueUrl"]]}

    received = json.loads(sqsq(door, "--json", "receive", name, "-n", "10").stdout)
    messages = received["Messages"]
    assert [m["MessageId"] for m in messages] == [sent["MessageId"]]
    assert messages[0]["Body"] == "json body"
    assert messages[0]["Attributes"]["ApproximateReceiveCount"] == "1"

    deleted = json.loads(sqsq(door, "--json", "delete", name,
                              messages[0]["ReceiptHandle"]).stdout)
    assert deleted == {"Deleted": True}
    assert client.receive_message(name, wait_time_seconds=0) == []

    sqsq(door, "queue", "purge", name)
    gone = sqsq(door, "--json", "queue", "delete", name).stdout
    assert json.loads(gone) == {"Deleted": name}
    assert client.list_queues(name) == []


def test_fifo_create_and_send(door: ServerProcess, client: Client) -> None:
    name = unique_name("clififo")
    url = sqsq(door, "queue", "create", name, "--fifo").stdout.strip()
    assert url.endswith(f"/{name}.fifo")
    sqsq(door, "send", f"{name}.fifo", "one", "--group", "g", "--dedup-id", "1")
    out = sqsq(door, "receive", f"{name}.fifo").stdout
    assert "group:" in out and "one" in out


def test_error_exits_1_with_the_sqs_code(door: ServerProcess) -> None:
    proc = sqsq(door, "send", unique_name("nope"), "x", check=False)
    assert proc.returncode == 1
    assert "error: QueueDoesNotExist" in proc.stderr
    assert proc.stdout == ""
    proc = sqsq(door, "queue", "attrs", unique_name("nope"), check=False)
    assert proc.returncode == 1
    assert "error: QueueDoesNotExist" in proc.stderr


def test_json_errors_are_json(door: ServerProcess) -> None:
    proc = sqsq(door, "--json", "send", unique_name("nope"), "x", check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    error = json.loads(proc.stderr)["Error"]
    assert error["Code"] == "QueueDoesNotExist" and error["Message"]


def test_body_from_stdin_or_a_file(door: ServerProcess, client: Client, tmp_path) -> None:
    name = unique_name("clibody")
    sqsq(door, "queue", "create", name)
    big = "x" * (300 * 1024)  # past what a shell passes as one argument
    sqsq(door, "send", name, "-", stdin=big)
    path = tmp_path / "body.txt"
    path.write_text("from a file\n")
    sqsq(door, "send", name, "--body-file", str(path))
    got = client.receive_message(name, max_number_of_messages=10, wait_time_seconds=0)
    assert sorted(m.body for m in got) == sorted([big, "from a file\n"])
    proc = sqsq(door, "send", name, check=False)  # no body at all
    assert proc.returncode == 2 and "--body-file" in proc.stderr


def test_server_help_lists_only_server_flags(door: ServerProcess) -> None:
    out = sqsq(door, "server", "--help").stdout
    assert "--data-dir" in out and "--json" not in out and "--endpoint" not in out


def test_unreachable_server_exits_1(tmp_path) -> None:
    dead = ServerProcess(tmp_path / "never-started")
    proc = sqsq(dead, "queue", "list", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ServiceUnavailable")


def test_server_start_errors_are_one_line(tmp_path) -> None:
    """A data dir another server holds (a second `make run`) and an out-of-range port: one
    clear line and exit status 1 or 2, no traceback."""
    import os

    env = dict(os.environ, SQSQ_ENDPOINT="")
    base = [sys.executable, "-m", "sqsq.cli.main", "server"]
    for args, status, text in (
        (["--grpc-port", "70000"], 2, "port 70000 is out of range"),
        (["--http-port", "http"], 2, "not a port number"),
    ):
        proc = subprocess.run([*base, "--data-dir", str(tmp_path / "d"), *args],
                              capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
        assert proc.returncode == status and text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_data_dir_in_use_is_one_line(tmp_path) -> None:
    first = ServerProcess(tmp_path / "data").start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sqsq.cli.main", "server", "--data-dir",
             str(tmp_path / "data"), "--grpc-port", str(free_port()),
             "--http-port", str(free_port())],
            capture_output=True, text=True, timeout=60, cwd=REPO)
    finally:
        first.stop()
    assert proc.returncode == 1, proc.stderr
    assert "is in use by another sqsq server" in proc.stderr
    assert "Traceback" not in proc.stderr
