"""The ports ``sqsq cluster up`` and the tests give their servers: free, and never in the
kernel's ephemeral range, where an outgoing connection could take one before its server
binds it (which failed a gateway's start with "address already in use")."""

from __future__ import annotations

import socket

import pytest

from sqsq.cli import localprocs
from sqsq.cli.localprocs import PORT_RANGE_ENV, free_port, free_port_range


def _ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = f.read().split()
    return int(low), int(high)


def test_free_ports_are_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert 1024 < port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_range_of_free_ports_fits_below_the_ephemeral_range_and_skips_one_in_use() -> None:
    low, _ = _ephemeral_range()
    for _ in range(20):
        base = free_port_range(4)
        assert base + 4 <= low
        socks = [socket.socket() for _ in range(4)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", base + i))
            # All four taken now: another range never overlaps them.
            again = free_port_range(4)
            assert again + 4 <= base or again >= base + 4
        finally:
            for s in socks:
                s.close()


def test_ports_handed_out_and_not_yet_bound_are_not_handed_out_again() -> None:
    """A cluster picks all its ports before its first server binds one: they must differ."""
    picked = [free_port() for _ in range(700)]
    picked += [p for base in (free_port_range(3) for _ in range(100))
               for p in range(base, base + 3)]
    assert len(set(picked)) == len(picked)


def test_a_port_range_in_the_environment_bounds_every_pick(monkeypatch) -> None:  # noqa: ANN001
    """Parallel test workers each pick from a range of their own (SQSQ_PORT_RANGE), and so do
    the servers they start, which inherit it."""
    monkeypatch.setenv(PORT_RANGE_ENV, "21000-21999")
    # none handed out yet (this process's earlier picks may lie in that range too)
    monkeypatch.setattr(localprocs, "_HANDED_OUT", localprocs.deque(maxlen=1000))
    for _ in range(50):
        assert 21000 <= free_port() <= 21999
        base = free_port_range(4)
        assert 21000 <= base and base + 3 <= 21999


def test_a_malformed_port_range_is_refused_with_its_name(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(PORT_RANGE_ENV, "21000")
    with pytest.raises(ValueError, match="SQSQ_PORT_RANGE='21000': expected LOW-HIGH"):
        free_port()
