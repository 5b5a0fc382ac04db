"""The etcd the tests start: ``sqsq.cli.localprocs`` (also what ``sqsq cluster up``
runs), on free 127.0.0.1 ports with a data dir of the test's own, stopped by pid."""

from sqsq.cli.localprocs import ETCD_MISSING, EtcdProcess, etcd_binary

__all__ = ["ETCD_MISSING", "EtcdProcess", "etcd_binary"]
