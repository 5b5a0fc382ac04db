"""A cluster's Admin API wants the credential ``sqsq cluster up`` makes in its directory: the
gateway and every node refuse a call without it, and ``cluster status --replicas`` (the
rolling restart's view) finds it in the cluster directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from serverproc import REPO
from sqsq import admincred
from sqsq.cli.backup import admin_channel
from sqsq.cli.cluster import LocalCluster
from sqsq.v1 import admin_pb2 as pb
from sqsq.v1 import admin_pb2_grpc as pb_grpc

# as an operator's shell has it: no credential in the env
ENV = {k: v for k, v in os.environ.items()
       if k not in (admincred.ENV_TOKEN, admincred.ENV_TOKEN_FILE)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=3, shards=1, env=dict(ENV))
    c.start()
    yield c
    c.stop()


def test_cluster_up_makes_a_private_credential(cluster: LocalCluster) -> None:
    path = cluster.root / admincred.FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cluster.env[admincred.ENV_TOKEN_FILE] == str(path)


def test_gateway_and_nodes_refuse_a_call_without_it(cluster: LocalCluster) -> None:
    for endpoint in [cluster.gateway.endpoint] + [n.endpoint for n in cluster.nodes]:
        with grpc.insecure_channel(endpoint) as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.AdminStub(channel).CreateSnapshot(pb.CreateSnapshotRequest(),
                                                          timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, endpoint


def test_the_gateway_passes_the_credential_on(cluster: LocalCluster) -> None:
    key = (cluster.root / admincred.FILE_NAME).read_bytes().strip()
    with admin_channel(cluster.gateway.endpoint, admin_key=key) as channel:
        admin = pb_grpc.AdminStub(channel)
        made = admin.CreateSnapshot(pb.CreateSnapshotRequest(), timeout=60)
        assert [s.shard_id for s in made.snapshots] == [0]
        for snap in made.snapshots:
            admin.DeleteSnapshot(pb.DeleteSnapshotRequest(path=snap.path), timeout=60)


def test_status_replicas_reads_the_cluster_directory(cluster: LocalCluster) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--dir",
         str(cluster.root), "--json", "--replicas"], capture_output=True, text=True,
        cwd=REPO, timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    replicas = json.loads(out.stdout)["replicas"]
    assert sorted(replicas) == ["n1", "n2", "n3"]
