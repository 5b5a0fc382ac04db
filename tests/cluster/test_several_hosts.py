"""A multi-host rehearsal: the commands docs/cluster.md gives an operator for several machines
("On several machines"), run as written, each process in a network namespace of its own with
its own address (the chaos suite's namespaces: nothing leaves this machine), with the secret
file copied to each node's host; then the SDK and boto3, from a client host of their own,
use the cluster through the gateway."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.netns import Net, namespaces
from serverproc import REPO
from sqsq.cli.localprocs import etcd_binary

HOSTS = {"etcd": "ETCD", "n1": "NODE1", "n2": "NODE2", "n3": "NODE3", "gateway": "GATEWAY"}

CLIENT = """
import json, sys, time
import boto3
from botocore.config import Config
from sqsq.client import Client
grpc, http = sys.argv[1:]
deadline = time.monotonic() + 90
while True:  # the shards are created once the three nodes are live
    try:
        with Client(grpc, timeout=10) as c:
            c.create_queue("rehearsal")
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
with Client(grpc, timeout=30) as c:
    c.send_message("rehearsal", "via the SDK")
sqs = boto3.client("sqs", endpoint_url=http, region_name="us-east-1",
                   aws_access_key_id="x", aws_secret_access_key="y",
                   config=Config(retries={"max_attempts": 3}))
url = sqs.get_queue_url(QueueName="rehearsal")["QueueUrl"]
sqs.send_message(QueueUrl=url, MessageBody="via boto3")
got = []
while len(got) < 2:
    for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                 WaitTimeSeconds=2).get("Messages", []):
        got.append(m["Body"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
print(json.dumps({"url": url, "bodies": sorted(got)}))
"""


def documented_commands() -> list[list[str]]:
    """The fenced block of docs/cluster.md's "On several machines", as argv lists."""
    text = (REPO / "docs" / "cluster.md").read_text()
    section = text.split("## On several machines", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "no command block in docs/cluster.md's 'On several machines'"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture
def net() -> Iterator[Net]:
    with Net([*HOSTS, "client"]) as n:
        yield n
    assert not [ns for ns in namespaces() if ns.startswith(n.tag)]


def test_the_documented_commands_make_a_cluster_that_boto3_and_the_sdk_use(
        net: Net, tmp_path: Path) -> None:
    secret_cmd, etcd_cmd, node_cmd, gateway_cmd = documented_commands()
    assert secret_cmd[:2] == ["head", "-c"] and etcd_cmd[0] == "etcd"
    assert node_cmd[:2] == ["sqsq", "node"] and gateway_cmd[:2] == ["sqsq", "gateway"]

    def place(argv: list[str], host: str, node: int = 1) -> list[str]:
        """The command as run on ``host``: machines' names are its addresses, paths are
        under the host's own directory, and ``sqsq`` is this checkout's."""
        root = tmp_path / host
        out = []
        for arg in argv:
            arg = arg.replace("NODE1", f"NODE{node}").replace("n1", f"n{node}") \
                if arg in ("NODE1", "n1") else arg
            for name, upper in HOSTS.items():
                arg = arg.replace(upper, net.ip(name))
            out.append(arg.replace("/etc/sqsq", str(root / "etc")).replace(
                "/var/lib/sqsq", str(root / "var")))
        head = {"sqsq": [sys.executable, "-m", "sqsq.cli.main"], "etcd": [etcd_binary()]}
        return [*head.get(out[0], [out[0]]), *out[1:]]

    made = tmp_path / "made"
    made.mkdir()
    subprocess.run(["bash", "-c", shlex.join(secret_cmd[:-2]) + " > " + shlex.quote(
        secret_cmd[-1].replace("/etc/sqsq", str(made)))], check=True, timeout=30)
    secret = made / "secret"
    assert len(secret.read_bytes()) == 32
    for i in (1, 2, 3):  # "copy it to the same path on every node machine"
        (tmp_path / f"n{i}" / "etc").mkdir(parents=True)
        shutil.copy(secret, tmp_path / f"n{i}" / "etc" / "secret")
    procs = [net.popen("etcd", place(etcd_cmd, "etcd"), log=tmp_path / "etcd.log")]
    for i in (1, 2, 3):
        argv = place(node_cmd, f"n{i}", i)
        assert argv[argv.index("--node-id") + 1] == f"n{i}"
        assert argv[argv.index("--advertise") + 1] == net.ip(f"n{i}")
        procs.append(net.popen(f"n{i}", argv, log=tmp_path / f"n{i}.log"))
    procs.append(net.popen("gateway", place(gateway_cmd, "gateway"),
                           log=tmp_path / "gateway.log"))
    gw = net.ip("gateway")
    net.wait_port("gateway", 7400, procs[-1], timeout=60)
    out = net.run("client", [sys.executable, "-c", CLIENT, f"{gw}:7400", f"http://{gw}:9324"],
                  timeout=180)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(tmp_path.glob("*.log")))
    assert out.returncode == 0, out.stderr[-3000:] + logs
    answer = json.loads(out.stdout)
    assert answer["url"] == f"http://{gw}:9324/000000000000/rehearsal"
    assert answer["bodies"] == ["via boto3", "via the SDK"]
    assert all(p.poll() is None for p in procs), logs
