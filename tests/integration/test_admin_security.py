"""The Admin API is never open: ``sqsq server`` makes an admin credential (0600, in its data
directory) and refuses every Admin call that does not prove it, also with the queue API open;
the receipt-handle secret goes only to a backup that proves it. Every port the server opens
listens on the ``--host`` it was given, and a short secret file is refused by name."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from listening import listening
from serverproc import REPO, ServerProcess
from sqsq import admincred
from sqsq.cli.backup import admin_channel
from sqsq.client import Client
from sqsq.v1 import admin_pb2 as pb
from sqsq.v1 import admin_pb2_grpc as pb_grpc

NO_ENV_CREDENTIAL = {admincred.ENV_TOKEN: "", admincred.ENV_TOKEN_FILE: ""}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose credential is its own, made in its data directory."""
    srv = ServerProcess(tmp_path_factory.mktemp("admin") / "data", env=NO_ENV_CREDENTIAL)
    srv.start()
    with Client(srv.endpoint) as c:
        c.create_queue("held")
        c.send_message("held", "a message the Admin API could peek")
    yield srv
    srv.stop()


def _key(srv: ServerProcess) -> bytes:
    return (srv.data_dir / admincred.FILE_NAME).read_bytes().strip()


def _refusals(srv: ServerProcess) -> list[str]:
    return [line for line in srv.log_text().splitlines() if "refused" in line]


def test_the_server_makes_a_private_credential(server: ServerProcess) -> None:
    path = server.data_dir / admincred.FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(_key(server)) >= admincred.MIN_BYTES


def test_no_admin_call_without_the_credential(server: ServerProcess) -> None:
    before = len(_refusals(server))
    with grpc.insecure_channel(server.endpoint) as channel:
        admin = pb_grpc.AdminStub(channel)
        calls = [
            lambda: admin.CreateSnapshot(pb.CreateSnapshotRequest(), timeout=10),
            lambda: admin.ReplicaStatus(pb.ReplicaStatusRequest(), timeout=10),
            lambda: admin.ReadPartitionMap(pb.ReadPartitionMapRequest(), timeout=10),
            lambda: admin.PeekMessages(pb.PeekMessagesRequest(queue_name="held"), timeout=10),
            lambda: admin.DeleteSnapshot(pb.DeleteSnapshotRequest(path="x"), timeout=10),
            # the secret, asked for directly: nothing comes back but the refusal
            lambda: list(admin.ReadSnapshot(
                pb.ReadSnapshotRequest(path="x", include_secret=True), timeout=10)),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "admin credential" in err.value.details()
    assert len(_refusals(server)) - before == len(calls)  # one log line each


def test_a_wrong_credential_is_refused(server: ServerProcess) -> None:
    with admin_channel(server.endpoint, admin_key=b"w" * 64) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.AdminStub(channel).ReplicaStatus(pb.ReplicaStatusRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_backup_with_the_credential_file_gets_the_secret(server: ServerProcess,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "backup"
    env = {**os.environ, **NO_ENV_CREDENTIAL}
    denied = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "backup", "--endpoint", server.endpoint,
         "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert denied.returncode == 1
    assert "PERMISSION_DENIED" in denied.stderr
    assert not (out / "secret").exists()
    done = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "backup", "--endpoint", server.endpoint,
         "--out", str(out), "--admin-token", str(server.data_dir / admincred.FILE_NAME)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert (out / "secret").read_bytes() == (server.data_dir / "secret").read_bytes()


def test_every_port_listens_on_the_host_given(server: ServerProcess) -> None:
    assert server.proc is not None
    found = listening(server.proc.pid)
    assert len(found) >= 3  # gRPC, SQS HTTP, the Raft transport (and frames)
    assert [a for a, _ in found if a != "127.0.0.1"] == []


def _start_refused(data_dir: Path) -> str:
    srv = ServerProcess(data_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", *srv.command(), "--host", "127.0.0.1",
         "--grpc-port", str(srv.grpc_port), "--http-port", str(srv.http_port)],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_a_short_secret_file_is_refused_by_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret").write_bytes(b"short\n")
    said = _start_refused(data)
    assert f"{data / 'secret'}: the receipt-handle secret is 6 bytes" in said
    assert "head -c 32 /dev/urandom" in said


def test_a_short_admin_credential_is_refused_by_name(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    short = tmp_path / "admin-token"
    short.write_text("1234\n")
    monkeypatch.delenv(admincred.ENV_TOKEN)
    monkeypatch.setenv(admincred.ENV_TOKEN_FILE, str(short))
    said = _start_refused(tmp_path / "data")
    assert f"{short}: the admin credential is 4 bytes" in said
