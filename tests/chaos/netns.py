"""Real network partitions for the chaos tests, the way Jepsen makes them: one Linux network
namespace per host (etcd, each node, the gateway, the client), each joined by a veth pair to a
bridge that lives in a namespace of its own, and faults as iptables DROP rules inside the
hosts' own namespaces.

    with Net(["etcd", "n1", "n2", "n3", "gateway", "client"]) as net:
        cluster = LocalCluster(root, placement=net).start()   # Net is a cluster Placement
        net.isolate("n1", ["n2", "n3"]); ...; net.heal()

Traffic rules (a mistake here sends packets off the machine):

- Nothing is created in the host's own namespace: every veth is created directly in its
  harness namespace, and the bridge sits in a namespace too. The host namespace therefore has
  no interface and no route in ``SUBNET``, and a harness namespace has no link to anything
  but the bridge.
- No harness namespace has a default route, so from inside one only ``lo`` and ``SUBNET``
  are reachable.
- ``check_isolation`` verifies both; it runs at setup and again before every fault.
- The host cannot reach ``SUBNET`` and must not try: its default route would send such a
  packet off the machine. Talk to the cluster from inside the "client" host (``popen``/``run``).
  While a Net is open the host's own OUTPUT chain also rejects everything bound for ``SUBNET``
  (one rule, tagged with the Net's name, removed at close; a rule, not a route or an
  interface): a harness mistake that talks to a namespace from the host fails at once
  instead of leaving the machine. (Once, a readiness probe run from the host did just that.)

Namespaces are named ``PREFIX-<pid>-<token>-<host>`` (the token tells apart the Nets of one
process); ``close`` (also run by ``__exit__``, at exit and on SIGTERM/SIGINT) kills every
process inside them and deletes them, and ``sweep_leftovers`` does the same for a run whose
pid is gone (one killed with SIGKILL).
``python tests/chaos/netns.py sweep`` runs the sweep by hand.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from sqsq.cli.localprocs import probe_argv, wait_by_probe

PREFIX = "sqsqchaos"
# Private, and on neither an interface nor a route of this machine (checked: eth0 has
# 192.0.2.0/24); setup refuses to start if the host has anything overlapping it anyway.
SUBNET = ipaddress.IPv4Network("10.213.7.0/24")
FIRST_HOST = 10  # host i gets SUBNET's address 10 + i
BRIDGE = "bridge"  # the bridge namespace's suffix; no host may be called that
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")  # "v-" + name fits IFNAMSIZ (15)
TOOLS_MISSING = ("the chaos tests need root, `ip` (iproute2) and `iptables`: `make system-deps` "
                 "installs iptables; they fail, never skip, without them")


class NetError(RuntimeError):
    """The harness cannot do what was asked."""


class IsolationError(NetError):
    """A namespace could route somewhere, or the host has something in the test subnet."""


def require_tools() -> None:
    """``NetError`` unless we are root with ``ip`` and ``iptables`` on the PATH."""
    missing = [t for t in ("ip", "iptables") if shutil.which(t) is None]
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "not root"
        raise NetError(f"{TOOLS_MISSING} ({why})")


def _run(argv: Sequence[str], timeout: float = 30.0) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise NetError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _json(argv: Sequence[str]) -> list[dict[str, Any]]:
    text = _run(argv).strip()
    return json.loads(text) if text else []  # some iproute2 versions print nothing for []


def namespaces(prefix: str = PREFIX) -> list[str]:
    """The network namespaces whose name starts with ``prefix-``."""
    names = (line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line)
    return [n for n in names if n.startswith(f"{prefix}-")]


def ns_pids(ns: str) -> list[int]:
    """The processes in namespace ``ns`` (zombies are not in any)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                         timeout=30)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has finished: only its parent's wait is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_pids(pids: Iterable[int], timeout_s: float = 10.0) -> None:
    """SIGKILL each pid (SIGCONT first, for a stopped one) and wait until they are gone."""
    pids = list(pids)
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise NetError(f"processes {[p for p in pids if pid_alive(p)]} outlived SIGKILL")
        time.sleep(0.02)


def delete_namespace(ns: str) -> None:
    """Kill what runs in ``ns``, then delete it (its veths and iptables rules go with it)."""
    kill_pids(ns_pids(ns))
    try:
        _run(["ip", "netns", "del", ns])
    except NetError:
        if ns in _run(["ip", "netns", "list"]).split():
            raise
        # Gone already: another process's sweep (a test beside this one) deleted it first.


def _fence_rule(subnet: ipaddress.IPv4Network, tag: str) -> list[str]:
    return ["OUTPUT", "-d", str(subnet), "-m", "comment", "--comment", tag,
            "-j", "REJECT", "--reject-with", "icmp-net-unreachable"]


def fences(prefix: str = PREFIX) -> list[tuple[str, str]]:
    """The host's OUTPUT fences of Nets: (tag, destination) for each."""
    out = _run(["iptables", "-w", "-S", "OUTPUT"])
    tag = rf'"?({re.escape(prefix)}-\d+-[0-9a-f]+)'
    return [(t, d) for d, t in re.findall(rf"-A OUTPUT -d (\S+) .*--comment {tag}", out)]


def sweep_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces ``prefix-<pid>-*`` whose pid is dead, and their fences; return
    the namespaces' names. (Those of a live pid are left alone, even if the pid was reused:
    swept once it ends.)"""
    for tag, dst in fences(prefix):
        pid = int(tag.split("-")[1])
        if pid != os.getpid() and not pid_alive(pid):
            try:
                _run(["iptables", "-w", "-D", *_fence_rule(ipaddress.IPv4Network(dst), tag)])
            except NetError:
                if (tag, dst) in fences(prefix):
                    raise  # still there: a real failure, not another sweep's deletion
    swept = []
    for ns in namespaces(prefix):
        match = re.match(rf"^{re.escape(prefix)}-(\d+)-", ns)
        if match and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1))):
            delete_namespace(ns)
            swept.append(ns)
    return swept


class Net:
    """One namespace per host on a private bridge; see the module's docstring."""

    def __init__(self, hosts: Sequence[str], *, subnet: ipaddress.IPv4Network = SUBNET,
                 prefix: str = PREFIX) -> None:
        hosts = list(hosts)
        bad = [h for h in hosts if not HOST_NAME.match(h) or h == BRIDGE]
        if bad or len(set(hosts)) != len(hosts):
            raise ValueError(f"host names must be distinct, [a-z][a-z0-9]{{0,11}}, not "
                             f"{BRIDGE!r}: {hosts}")
        if FIRST_HOST + len(hosts) >= subnet.num_addresses - 1:
            raise ValueError(f"{len(hosts)} hosts do not fit in {subnet}")
        self.hosts = hosts
        self.subnet = subnet
        self.prefix = prefix
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(2)}"
        self._addresses = {h: str(subnet.network_address + FIRST_HOST + i)
                           for i, h in enumerate(hosts)}
        self._made: list[str] = []
        self._throttled: set[str] = set()
        self._procs: list[subprocess.Popen] = []
        self._hooked: dict[int, Any] = {}
        self._pending: int | None = None
        self._closing = threading.Lock()
        self._fenced = False  # the host's OUTPUT rule rejecting the subnet

    # -- names and the cluster Placement protocol ------------------------------------------

    def ns(self, host: str) -> str:
        if host not in self._addresses:
            raise KeyError(f"no host {host!r} in this Net ({', '.join(self.hosts)})")
        return f"{self.tag}-{host}"

    def ip(self, host: str) -> str:
        self.ns(host)
        return self._addresses[host]

    def address(self, name: str) -> str:
        return self.ip(name)

    def command(self, name: str, argv: list[str]) -> list[str]:
        # `ip netns exec` enters the namespace and execs argv: the pid stays the same.
        return ["ip", "netns", "exec", self.ns(name), *argv]

    # -- setup -----------------------------------------------------------------------------

    def __enter__(self) -> Net:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Net:
        """Make the namespaces, the bridge and the links; check isolation."""
        require_tools()
        sweep_leftovers(self.prefix)
        self._hook()  # before anything exists, so an interrupted setup is undone too
        try:
            try:
                self._check_outside(None)
            except IsolationError as exc:
                raise NetError(f"{self.subnet} is in use on this machine; pick another "
                               f"subnet: {exc}") from None
            _run(["iptables", "-w", "-I", *_fence_rule(self.subnet, self.tag)])
            self._fenced = True
            self._build()
            self.check_isolation()
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._made.append(ns)
        # No IPv6 at all (set before any veth exists): no link-local addresses, nothing
        # to route but the one IPv4 subnet.
        _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
              "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        _run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])

    def _build(self) -> None:
        bridge = f"{self.tag}-{BRIDGE}"
        self._add_ns(bridge)
        _run(["ip", "-n", bridge, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", bridge, "link", "set", "dev", "br0", "up"])
        for host in self.hosts:
            ns, port = self.ns(host), f"v-{host}"
            self._add_ns(ns)
            # Both ends are created in their namespaces: never, even briefly, in the host's.
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                  "peer", "name", port, "netns", bridge])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip(host)}/{self.subnet.prefixlen}",
                  "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "dev", "eth0", "up"])
            _run(["ip", "-n", bridge, "link", "set", "dev", port, "master", "br0", "up"])

    # -- isolation -------------------------------------------------------------------------

    def check_isolation(self, outside: str | None = None) -> None:
        """``IsolationError`` unless no namespace made here has a default route or a route
        beyond the subnet, and the host's namespace (or ``outside``, a namespace standing in
        for it) has no address and no route in the subnet."""
        problems = []
        for ns in self._made:
            for family in ("-4", "-6"):
                for r in _json(["ip", "-n", ns, family, "-j", "route", "show", "table", "all"]):
                    dst = r.get("dst", "")
                    if dst == "default":
                        problems.append(f"{ns} has a default route ({family}): {r}")
                    elif r.get("table", "main") == "main" and not self._inside(dst):
                        problems.append(f"{ns} has a route beyond {self.subnet}: {r}")
        if outside is None and subprocess.run(
                ["iptables", "-w", "-C", *_fence_rule(self.subnet, self.tag)],
                capture_output=True).returncode != 0:
            problems.append(f"the host's OUTPUT chain does not reject {self.subnet}")
        if problems:
            raise IsolationError("; ".join(problems))
        self._check_outside(outside)

    def _inside(self, dst: str) -> bool:
        try:
            return ipaddress.ip_network(dst, strict=False).subnet_of(self.subnet)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return False

    def _overlaps(self, dst: str) -> bool:
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            return False
        return net.version == 4 and net.prefixlen > 0 and net.overlaps(self.subnet)

    def _check_outside(self, outside: str | None) -> None:
        ip = ["ip"] if outside is None else ["ip", "-n", outside]
        where = outside or "the host namespace"
        problems = []
        for link in _json([*ip, "-4", "-j", "addr", "show"]):
            for a in link.get("addr_info", []):
                if self._overlaps(f"{a.get('local')}/{a.get('prefixlen')}"):
                    problems.append(f"{where}: {link.get('ifname')} has {a.get('local')}")
        for r in _json([*ip, "-4", "-j", "route", "show", "table", "all"]):
            if self._overlaps(r.get("dst", "")):
                problems.append(f"{where}: route {r}")
        if problems:
            raise IsolationError("; ".join(problems))

    # -- faults: DROP on arrival, inside the receiving host's namespace --------------------
    # Dropped in INPUT, not OUTPUT: an OUTPUT drop fails the sender's send at once (EPERM),
    # which no real network does; dropped on arrival, the sender just hears nothing.

    def _guard(self) -> None:
        self.check_isolation()  # again, before every fault

    def _drop(self, receiver: str, sender: str) -> None:
        rule = ["INPUT", "-s", self.ip(sender), "-j", "DROP"]
        ipt = ["ip", "netns", "exec", self.ns(receiver), "iptables", "-w"]
        if subprocess.run([*ipt, "-C", *rule], capture_output=True).returncode != 0:
            _run([*ipt, "-A", *rule])

    def cut_one_way(self, src: str, dst: str) -> None:
        """Packets from ``src`` to ``dst`` are lost; ``dst`` to ``src`` still arrive."""
        self._guard()
        self._drop(dst, src)

    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b``, either way."""
        self._guard()
        self._drop(a, b)
        self._drop(b, a)

    def isolate(self, host: str, from_hosts: Iterable[str] | None = None) -> None:
        """Cut ``host`` from each of ``from_hosts`` (default: every other host)."""
        others = [h for h in (self.hosts if from_hosts is None else from_hosts) if h != host]
        self._guard()
        for other in others:
            self._drop(host, other)
            self._drop(other, host)

    def heal(self, *, throttles: bool = True) -> None:
        """Every cut undone (the INPUT chain of every host flushed), and every throttle
        unless told not to."""
        for host in self.hosts:
            _run(["ip", "netns", "exec", self.ns(host), "iptables", "-w", "-F", "INPUT"])
        for host in sorted(self._throttled) if throttles else ():
            self.unthrottle(host)

    def throttle(self, host: str, rate: str) -> None:
        """``host``'s link limited to ``rate`` (tc's units: "4mbit") both ways: a token
        bucket on its own end of the veth (what it sends) and on the bridge's end (what it
        receives). A token bucket, not netem: this kernel has no netem."""
        self._guard()
        bridge = f"{self.tag}-{BRIDGE}"
        for ns, dev in ((self.ns(host), "eth0"), (bridge, f"v-{host}")):
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                  "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"])
        self._throttled.add(host)

    def unthrottle(self, host: str) -> None:
        bridge = f"{self.tag}-{BRIDGE}"
        for ns, dev in ((self.ns(host), "eth0"), (bridge, f"v-{host}")):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
                            "root"], capture_output=True, timeout=30)  # none there: fine
        self._throttled.discard(host)

    def rules(self, host: str) -> list[str]:
        """``iptables -S INPUT`` inside ``host``."""
        return _run(["ip", "netns", "exec", self.ns(host), "iptables", "-w", "-S",
                     "INPUT"]).splitlines()

    # -- processes -------------------------------------------------------------------------

    def popen(self, host: str, argv: Sequence[str], log: Path | IO[bytes] | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """``argv`` running in ``host`` (its pid is the process's own), output to ``log``."""
        out: Any = open(log, "ab") if isinstance(log, Path) else log  # noqa: SIM115
        try:
            proc = subprocess.Popen(self.command(host, list(argv)),
                                    stdout=out if out is not None else subprocess.DEVNULL,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            if isinstance(log, Path):
                out.close()
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` run to its end in ``host``, output captured."""
        return subprocess.run(self.command(host, list(argv)), capture_output=True, text=True,
                              timeout=timeout, env=env)

    def wait_port(self, host: str, port: int, proc: subprocess.Popen | None = None,
                  timeout: float = 30.0, address: str | None = None) -> None:
        """Until ``address`` (default: ``host``'s own):``port`` accepts a connection made
        from inside ``host``; ``OSError`` if not in time or ``proc`` exits first."""
        target = address or self.ip(host)
        wait_by_probe(self.command(host, probe_argv("port", target, port, timeout)), proc,
                      timeout, f"nothing listened on {target}:{port} in {host} in {timeout}s")

    def pids(self) -> list[int]:
        """Every process running in a namespace made here."""
        return [pid for ns in self._made for pid in ns_pids(ns)]

    # -- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in the namespaces made here (by pid), delete them. Idempotent;
        ``NetError`` if something could not be removed."""
        if not self._closing.acquire(blocking=False):
            return
        try:
            kill_pids([p.pid for p in self._procs if p.poll() is None])
            for p in self._procs:
                p.wait()
            self._procs.clear()
            kill_pids(self.pids())  # also those others started here (a LocalCluster's)
            failed = []
            for ns in list(reversed(self._made)):
                try:
                    _run(["ip", "netns", "del", ns])
                    self._made.remove(ns)
                except NetError as exc:
                    failed.append(str(exc))
            if self._fenced and not self._made:  # lifted only once nothing is left inside
                _run(["iptables", "-w", "-D", *_fence_rule(self.subnet, self.tag)])
                self._fenced = False
            if failed:
                raise NetError("; ".join(failed))
            self._unhook()
        finally:
            self._closing.release()
        if self._pending is not None:  # a SIGTERM/SIGINT came while closing: act on it now
            signum, self._pending = self._pending, None
            signal.raise_signal(signum)

    def _hook(self) -> None:
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._hooked[sig] = signal.signal(sig, self._on_signal)

    def _unhook(self) -> None:
        atexit.unregister(self.close)
        for sig, old in self._hooked.items():
            signal.signal(sig, old)
        self._hooked.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._closing.locked():
            self._pending = signum  # interrupted close() itself: let it finish first
            return
        try:
            self.close()
        finally:
            # Handled as before we hooked it: e.g. SIGTERM ends the process, SIGINT raises
            # KeyboardInterrupt.
            self._unhook()
            signal.raise_signal(signum)


if __name__ == "__main__":
    if sys.argv[1:] != ["sweep"]:
        raise SystemExit("usage: netns.py sweep  (deletes the namespaces of dead runs)")
    require_tools()
    for name in sweep_leftovers():
        print(f"deleted {name}")
