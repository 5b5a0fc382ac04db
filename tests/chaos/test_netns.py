"""The chaos harness's network namespaces, with real processes: a cluster (etcd, three nodes,
a gateway) each in a namespace of its own serves a client in another; the isolation checks
catch a default route and a host-side address; isolating a shard leader from its followers
gets a new leader elected while the gateway still reaches the old one; and nothing is left
behind: not by ``close``, not by SIGTERM, and a run killed with SIGKILL is swept.

These need root, ``ip`` and ``iptables``: without them they fail, never skip.
Nothing here talks to the test subnet from the host (it has no route there but the default
one, off the machine): every probe runs inside a namespace, but for one that the host's
fence must reject, made only once the fence is seen in place.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from chaos.netns import (
    PREFIX,
    IsolationError,
    Net,
    NetError,
    fences,
    namespaces,
    ns_pids,
    pid_alive,
    require_tools,
    sweep_leftovers,
)
from sqsq.cli.cluster import LocalCluster

HOSTS = ["etcd", "n1", "n2", "n3", "gateway", "client"]
TESTS = Path(__file__).resolve().parents[1]

# Run inside the client's namespace: create a queue, send, receive, delete.
ROUND_TRIP = """
import json, sys
from sqsq.client import Client
endpoint, queue, body = sys.argv[1:]
with Client(endpoint, timeout=20) as c:
    c.create_queue(queue)
    c.send_message(queue, body)
    got = c.receive_message(queue, wait_time_seconds=5)
    for m in got:
        c.delete_message(queue, m.receipt_handle)
print(json.dumps([m.body for m in got]))
"""

CONNECTS = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
except OSError:
    sys.exit(1)
"""


def connects(net: Net, host: str, address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from inside ``host`` to ``address:port`` is accepted."""
    out = net.run(host, [sys.executable, "-c", CONNECTS, address, str(port), str(timeout)])
    return out.returncode == 0


def round_trip(net: Net, cluster: LocalCluster, queue: str, body: str,
               within_s: float = 0.0) -> list[str]:
    """The bodies a send + receive through the gateway got back, run from the client's
    namespace; tried again on a fresh queue (an "outcome unknown" answer while a leader
    changes) until ``within_s`` has gone by."""
    deadline = time.monotonic() + within_s
    for attempt in range(100):
        out = net.run("client", [sys.executable, "-c", ROUND_TRIP, cluster.gateway.endpoint,
                                 f"{queue}-{attempt}", body], timeout=60)
        if out.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with Net(HOSTS) as n:
        yield n
    assert not [ns for ns in namespaces() if ns.startswith(n.tag)]


@pytest.fixture(scope="module")
def cluster(net: Net, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("netns-cluster"), nodes=3, shards=1,
                     placement=net)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()


def test_the_tools_are_required_not_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    require_tools()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NetError, match="iptables"):
        require_tools()


def test_a_namespaced_cluster_serves_a_client_in_its_own_namespace(
        net: Net, cluster: LocalCluster) -> None:
    assert cluster.gateway.endpoint == f"{net.ip('gateway')}:{cluster.gateway.grpc_port}"
    assert cluster.etcd.endpoint.startswith(net.ip("etcd") + ":")
    status = cluster.status()
    assert {n["id"]: n["grpc"] for n in status["nodes"]} == {
        n.node_id: n.endpoint for n in cluster.nodes}
    assert all(n["alive"] for n in status["nodes"])
    # Each process runs in its own namespace, under the pid LocalCluster knows.
    for name, proc in [("etcd", cluster.etcd.proc), ("gateway", cluster.gateway.proc),
                       *((n.node_id, n.proc) for n in cluster.nodes)]:
        assert proc is not None and proc.pid in ns_pids(net.ns(name)), name
    assert round_trip(net, cluster, "netns-hello", "over the bridge") == ["over the bridge"]


def test_check_isolation_catches_a_default_route(net: Net) -> None:
    net.check_isolation()
    ns = net.ns("client")
    # On-link inside the subnet: even if used, it leads only to the bridge namespace.
    subprocess.run(["ip", "-n", ns, "route", "add", "default", "via",
                    str(net.subnet.network_address + 1), "dev", "eth0"], check=True)
    try:
        with pytest.raises(IsolationError, match="default route"):
            net.check_isolation()
        with pytest.raises(IsolationError):
            net.cut("n1", "n2")  # no fault while isolation does not hold
        assert not [r for r in net.rules("n1") if "DROP" in r]
    finally:
        subprocess.run(["ip", "-n", ns, "route", "del", "default"], check=True)
    net.check_isolation()


@pytest.mark.parametrize("how", ["address", "route"])
def test_check_isolation_catches_the_subnet_outside_its_namespaces(net: Net, how: str) -> None:
    """A throwaway namespace stands in for the host's, so the host itself is never touched;
    it is named like the harness's, so a sweep removes it if this test dies."""
    scratch = f"{PREFIX}-{os.getpid()}-scratch"
    subprocess.run(["ip", "netns", "add", scratch], check=True)
    try:
        net.check_isolation(outside=scratch)
        ip = ["ip", "-n", scratch]
        # A veth pair with both ends in the throwaway namespace (no dummy driver here).
        subprocess.run([*ip, "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                       check=True)
        subprocess.run([*ip, "link", "set", "d0", "up"], check=True)
        if how == "address":
            subprocess.run([*ip, "addr", "add", str(net.subnet.network_address + 250) + "/32",
                            "dev", "d0"], check=True)
        else:
            subprocess.run([*ip, "route", "add", str(net.subnet), "dev", "d0"], check=True)
        with pytest.raises(IsolationError, match=scratch):
            net.check_isolation(outside=scratch)
    finally:
        subprocess.run(["ip", "netns", "del", scratch], check=True)
    net.check_isolation()


def test_an_isolated_leader_is_replaced_and_rejoins_after_heal(
        net: Net, cluster: LocalCluster) -> None:
    shard = cluster.status()["shards"][0]
    old = shard["leader"]
    followers = [r for r in shard["replicas"] if r != old]
    node = next(n for n in cluster.nodes if n.node_id == old)
    assert connects(net, followers[0], node.host, node.grpc_port)

    started = time.monotonic()
    net.isolate(old, followers)
    try:
        new = None
        while new not in followers:
            assert time.monotonic() - started < 15, f"no new leader: {cluster.status()}"
            new = cluster.status()["shards"][0]["leader"]
        elected_after = time.monotonic() - started
        # The old leader is cut from its followers only: the gateway still reaches it.
        assert connects(net, "gateway", node.host, node.grpc_port)
        assert not connects(net, followers[0], node.host, node.grpc_port)
        other = next(n for n in cluster.nodes if n.node_id == followers[1])
        assert not connects(net, old, other.host, other.grpc_port)
        # The majority side serves through the gateway meanwhile.
        assert round_trip(net, cluster, "netns-split", "during") == ["during"]
    finally:
        net.heal()
    assert elected_after < 10
    assert not [r for h in HOSTS for r in net.rules(h) if "DROP" in r]
    assert connects(net, followers[0], node.host, node.grpc_port)
    # With pre-vote the old leader's term did not move while it was cut off; it rejoins
    # as a follower (requests may still meet a leader change for a moment).
    assert round_trip(net, cluster, "netns-healed", "after", within_s=15) == ["after"]
    status = cluster.status()
    assert status["shards"][0]["leader"] in status["shards"][0]["replicas"]
    assert all(n["alive"] for n in status["nodes"])


def test_the_host_cannot_reach_the_subnet_while_a_net_is_open(net: Net) -> None:
    """A harness mistake, talking to a namespace from the host process, fails at once
    instead of sending packets off the machine by the default route: the host's OUTPUT
    chain rejects the subnet while the Net is open."""
    assert (net.tag, str(net.subnet)) in fences()  # checked first: without it, no probe
    with pytest.raises(OSError) as refused:
        socket.create_connection((net.ip("n1"), 9), timeout=5)
    assert refused.value.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED,
                                   errno.EPERM)


def test_check_isolation_catches_a_missing_fence(net: Net) -> None:
    rule = ["OUTPUT", "-d", str(net.subnet), "-m", "comment", "--comment", net.tag,
            "-j", "REJECT", "--reject-with", "icmp-net-unreachable"]
    subprocess.run(["iptables", "-w", "-D", *rule], check=True)
    try:
        with pytest.raises(IsolationError, match="does not reject"):
            net.check_isolation()
    finally:
        subprocess.run(["iptables", "-w", "-I", *rule], check=True)
    net.check_isolation()


def test_close_kills_what_it_started_and_deletes_its_namespaces() -> None:
    net = Net(["a", "b"]).open()
    tag = net.tag
    sleeper = net.popen("a", ["sleep", "600"])
    stopped = net.popen("b", ["sleep", "600"])
    deadline = time.monotonic() + 5
    while sleeper.pid not in ns_pids(net.ns("a")) or stopped.pid not in ns_pids(net.ns("b")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # `ip netns exec` execs: the Popen's pid is the program's own.
    assert Path(f"/proc/{sleeper.pid}/exe").resolve().name == "sleep"
    os.kill(stopped.pid, signal.SIGSTOP)
    net.close()
    assert sleeper.returncode is not None and stopped.returncode is not None
    assert not [ns for ns in namespaces() if ns.startswith(tag)]
    assert tag not in dict(fences())  # the host's fence is lifted with them
    net.close()  # idempotent


CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from chaos.netns import Net
net = Net(["x", "y"]).open()
p = net.popen("x", ["sleep", "600"])
print(p.pid, flush=True)
time.sleep(600)
"""


def _child_with_a_net() -> tuple[subprocess.Popen, int, str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(TESTS)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip().isdigit(), f"the child did not start its Net ({child.wait()})"
    tag = f"{PREFIX}-{child.pid}-"
    assert len([ns for ns in namespaces() if ns.startswith(tag)]) == 3  # x, y, bridge
    return child, int(line), tag


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_cleans_up_before_the_process_ends(sig: signal.Signals) -> None:
    child, sleeper, tag = _child_with_a_net()
    child.send_signal(sig)
    # Then the signal does what it did before: SIGINT's KeyboardInterrupt, uncaught, ends
    # Python by SIGINT too.
    assert child.wait(timeout=30) == -sig
    assert not [ns for ns in namespaces() if ns.startswith(tag)]
    assert not pid_alive(sleeper)


def test_a_run_killed_with_sigkill_is_swept_later() -> None:
    child, sleeper, tag = _child_with_a_net()
    child.kill()
    child.wait()
    left = sorted(ns for ns in namespaces() if ns.startswith(tag))
    assert len(left) == 3 and pid_alive(sleeper)  # SIGKILL gave it no chance to clean up
    assert [t for t in dict(fences()) if t.startswith(tag)]  # its fence too
    swept = sweep_leftovers()
    assert set(left) <= set(swept)
    assert not [ns for ns in namespaces() if ns.startswith(tag)]
    assert not [t for t in dict(fences()) if t.startswith(tag)]
    assert not pid_alive(sleeper)


def _scripted_ip(monkeypatch: pytest.MonkeyPatch, listed: str,
                 rules: Sequence[str] = ()) -> list[list[str]]:
    """``ip``/``iptables`` as a sweep racing another process sees them: a delete fails with
    "No such file", the namespaces then listed are ``listed``, and the host's OUTPUT rules
    are ``rules``, one listing after the other (none once they run out). Nothing runs for
    real."""
    from chaos import netns

    calls: list[list[str]] = []
    listings = iter(rules)

    def run(argv: list[str], timeout: float = 30.0) -> str:
        calls.append(list(argv))
        if argv[:3] == ["ip", "netns", "del"] or argv[:3] == ["iptables", "-w", "-D"]:
            raise NetError(f"{' '.join(argv)} failed (1): No such file or directory")
        if argv[:3] == ["ip", "netns", "list"]:
            return listed
        if argv[:3] == ["iptables", "-w", "-S"]:
            return next(listings, "")
        raise AssertionError(f"unexpected command {argv}")

    monkeypatch.setattr(netns, "_run", run)
    monkeypatch.setattr(netns, "ns_pids", lambda ns: [])
    return calls


def test_a_namespace_another_sweep_deleted_first_is_not_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos import netns

    gone = f"{PREFIX}-1-ab-x"
    calls = _scripted_ip(monkeypatch, listed="")
    netns.delete_namespace(gone)  # deleted meanwhile by someone else: done
    assert ["ip", "netns", "del", gone] in calls


def test_a_namespace_still_there_after_a_failed_delete_is_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos import netns

    stuck = f"{PREFIX}-1-ab-x"
    _scripted_ip(monkeypatch, listed=f"{stuck} (id: 3)\n")
    with pytest.raises(NetError, match="No such file"):
        netns.delete_namespace(stuck)


def test_a_fence_another_sweep_lifted_first_is_not_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tag = f"{PREFIX}-999999999-ab"  # a pid no process has: its run is over
    rule = (f"-A OUTPUT -d 10.213.0.0/24 -m comment --comment {tag} "
            "-j REJECT --reject-with icmp-net-unreachable\n")
    # listed by this sweep, then lifted by the other
    calls = _scripted_ip(monkeypatch, listed="", rules=[rule, ""])
    assert sweep_leftovers() == []
    assert any(c[:3] == ["iptables", "-w", "-D"] for c in calls)
