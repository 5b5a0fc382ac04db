from __future__ import annotations

from collections.abc import Iterator

import pytest

from etcdproc import EtcdProcess


@pytest.fixture
def etcd_proc(tmp_path) -> Iterator[EtcdProcess]:  # noqa: ANN001
    """A real etcd of the test's own on free 127.0.0.1 ports, stopped by pid."""
    proc = EtcdProcess(tmp_path / "etcd").start()
    yield proc
    proc.stop()
