"""deploy/docker-compose.yml and deploy/Dockerfile, checked without a Docker engine: every
command is parsed by sqsq's own argument parser (no abbreviations: a flag is spelled in full
or the test fails), the services agree with each other (etcd address, shards, secret, node
ids, ports, volumes), and the image installs this repository with ``sqsq`` as its entrypoint.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sqsq.cli.localprocs import etcd_binary
from sqsq.cli.main import build_parser, cmd_gateway, cmd_node

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
NODES = ("n1", "n2", "n3")
ETCDS = ("etcd1", "etcd2", "etcd3")


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def _service(name: str) -> dict[str, Any]:
    return _compose()["services"][name]


def _strict_parser() -> argparse.ArgumentParser:
    """sqsq's parser, refusing abbreviations: argparse would take ``--shard`` for ``--shards``,
    and a flag in a deployment file should be the one ``--help`` shows."""
    parser = build_parser()
    pending = [parser]
    while pending:
        p = pending.pop()
        p.allow_abbrev = False
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


def parse_sqsq(command: list[Any]) -> argparse.Namespace:
    """A compose ``command`` (the arguments of the image's ``sqsq`` entrypoint) as the real
    ``sqsq`` parser reads it; fails with argparse's own message if it would not start."""
    assert isinstance(command, list), f"command must be a list, not {command!r}"
    assert all(isinstance(a, str) for a in command), f"every argument a string: {command}"
    assert command[:1] != ["sqsq"], "the entrypoint is already sqsq; it would run `sqsq sqsq`"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = _strict_parser().parse_args(command)
    except SystemExit as exc:
        pytest.fail(f"`sqsq {shlex.join(command)}` is not a valid sqsq command "
                    f"(exit {exc.code}): {err.getvalue().strip()}")
    return args


def _node(name: str) -> argparse.Namespace:
    args = parse_sqsq(_service(name)["command"])
    # what cmd_node checks after parsing: a cluster node (not a static group) with an id
    assert args.handler is cmd_node, f"{name} does not run `sqsq node`"
    assert args.etcd is not None and args.peers is None and args.node_id, name
    return args


def _gateway() -> argparse.Namespace:
    args = parse_sqsq(_service("gateway")["command"])
    assert args.handler is cmd_gateway, "the gateway service does not run `sqsq gateway`"
    assert args.etcd is not None and args.backend is None  # as cmd_gateway checks
    return args


def _expose(service: dict[str, Any]) -> set[int]:
    ports: set[int] = set()
    for entry in service.get("expose", []):
        low, _, high = str(entry).partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def _published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each ``ports`` entry."""
    out = []
    for entry in service.get("ports", []):
        *host, container = str(entry).split(":")
        address = host[0] if len(host) == 2 else "0.0.0.0"
        out.append((address, int(host[-1]), int(container)))
    return out


def _etcd_flags(command: list[str]) -> dict[str, str]:
    flags = {}
    for i, arg in enumerate(command):
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            flags[name] = value if sep else command[i + 1]
    return flags


# -- the topology ----------------------------------------------------------------------------

def test_services() -> None:
    compose = _compose()
    assert {*ETCDS, "gateway", *NODES} <= set(compose["services"])
    for name in (*NODES, "gateway"):
        service = compose["services"][name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        context = (DEPLOY / service["build"]["context"]).resolve()
        assert context == REPO, "the image is built from the repository root"
        assert "entrypoint" not in service, f"{name}: the image's entrypoint is sqsq"


def test_a_misspelled_or_abbreviated_flag_fails() -> None:
    """The guard itself: one wrong flag in a copy of a real command is caught."""
    good = list(_service("n1")["command"])
    parse_sqsq(good)
    for wrong, right in (("--nodeid", "--node-id"), ("--shard", "--shards"),
                         ("--secret", "--secret-file")):
        bad = [wrong if a == right else a for a in good]
        with pytest.raises(pytest.fail.Exception, match="not a valid sqsq command"):
            parse_sqsq(bad)
    with pytest.raises(pytest.fail.Exception, match="not a valid sqsq command"):
        parse_sqsq(["nodes", *good[1:]])
    with pytest.raises(pytest.fail.Exception, match="not a valid sqsq command"):
        parse_sqsq([*good, "--grpc-port", "seventy"])  # a value its type refuses


def test_nodes_agree() -> None:
    compose = _compose()
    nodes = {name: _node(name) for name in NODES}
    assert len({a.node_id for a in nodes.values()}) == len(NODES), "node ids must differ"
    assert len({a.shards for a in nodes.values()}) == 1, "every node needs the same --shards"
    assert len({a.secret_file for a in nodes.values()}) == 1
    for name, args in nodes.items():
        service = compose["services"][name]
        assert args.etcd == "etcd:2379", f"{name} must reach the etcd service"
        assert args.advertise == name, f"{name}: --advertise is how other containers reach it"
        assert args.host == "0.0.0.0", f"{name} must listen beyond its own loopback"
        raft = {args.raft_port}  # one Raft port carries every shard's group
        assert args.grpc_port not in raft, f"{name}: the gRPC port is its Raft port"
        missing = ({args.grpc_port} | raft) - _expose(service)
        assert not missing, f"{name} listens on {sorted(missing)} but does not expose them"
        assert "ports" not in service, f"{name}: a node publishes nothing on the host"


def test_each_node_keeps_its_data_in_its_own_volume() -> None:
    compose = _compose()
    seen = set()
    for name in NODES:
        args = _node(name)
        mounts = [str(v).split(":") for v in compose["services"][name]["volumes"]]
        volumes = [source for source, target, *_ in mounts if target == args.data_dir]
        assert len(volumes) == 1, f"{name}: no volume at its --data-dir {args.data_dir}"
        assert volumes[0] in compose["volumes"], f"{name}: {volumes[0]} is not a named volume"
        seen.add(volumes[0])
    assert len(seen) == len(NODES), "every node needs a data volume of its own"


def test_every_node_reads_the_same_secret_and_shares_the_admin_credential() -> None:
    compose = _compose()
    assert set(compose["secrets"]) == {"cluster-secret", "admin-token"}
    for node in NODES:
        assert set(compose["services"][node]["secrets"]) == {"cluster-secret", "admin-token"}
        assert _node(node).secret_file == "/run/secrets/cluster-secret"
    for service in [*NODES, "gateway"]:
        env = compose["services"][service]["environment"]
        assert env["SQSQ_ADMIN_TOKEN_FILE"] == "/run/secrets/admin-token", service
    assert "admin-token" in compose["services"]["gateway"]["secrets"]
    ignored = (DEPLOY / ".gitignore").read_text().split()
    for secret in compose["secrets"].values():
        path = (DEPLOY / secret["file"]).resolve()
        assert path.parent == DEPLOY
        assert f"/{path.name}" in ignored or path.name in ignored, \
            f"{path.name} must stay out of git"


def test_gateway() -> None:
    args = _gateway()
    service = _service("gateway")
    assert args.etcd == "etcd:2379"
    assert args.host == "0.0.0.0"
    assert args.grpc_port != args.http_port
    published = {container: (address, host) for address, host, container in _published(service)}
    frame_port = int(service["environment"]["SQSQ_FRAME_PORT"])  # published: clients use it
    assert set(published) == {args.grpc_port, args.http_port, frame_port}
    if args.public_url:
        assert args.public_url.endswith(f":{published[args.http_port][1]}")


def test_host_ports_do_not_clash() -> None:
    taken = [(address, port) for service in _compose()["services"].values()
             for address, port, _ in _published(service)]
    assert len(taken) == len(set(taken))


def test_etcd_members() -> None:
    """Three members that name each other, each with its data in a volume of its own and
    answering to the alias "etcd" too, which is what the nodes and the gateway are given
    (sqsq's etcd client spreads over every address a name resolves to)."""
    compose, volumes = _compose(), set()
    peers = {name: f"http://{name}:2380" for name in ETCDS}
    for name in ETCDS:
        service = _service(name)
        flags = _etcd_flags(service["command"])
        assert flags["--name"] == name
        assert flags["--advertise-client-urls"] == f"http://{name}:2379"
        assert flags["--initial-advertise-peer-urls"] == peers[name]
        assert "0.0.0.0:2379" in flags["--listen-client-urls"]
        assert dict(p.split("=", 1) for p in flags["--initial-cluster"].split(",")) == peers
        assert "etcd" in service["networks"]["default"]["aliases"]
        data = [str(v).split(":") for v in service["volumes"]]
        (volume,) = [source for source, target in data if target == flags["--data-dir"]]
        assert volume in compose["volumes"]
        volumes.add(volume)
        for dependent in (*NODES, "gateway"):
            assert _service(dependent)["depends_on"][name] == {"condition": "service_healthy"}
    assert len(volumes) == len(ETCDS)
    assert any(container == 2379 for _, _, container in _published(_service("etcd1")))


def test_etcd_flags_exist_in_the_same_etcd_line() -> None:
    """The flags are checked against the etcd the tests run (Debian's etcd-server), which
    must be of the image's minor version."""
    service = _service("etcd1")
    tag = re.fullmatch(r"v(\d+\.\d+)\.\d+", service["image"].rpartition(":")[2])
    assert tag, service["image"]
    etcd = etcd_binary()
    version = subprocess.run([etcd, "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    assert f"etcd Version: {tag.group(1)}." in version, (service["image"], version)
    help_text = subprocess.run([etcd, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, re.MULTILINE))
    unknown = set(_etcd_flags(service["command"])) - known
    assert not unknown, f"not etcd {tag.group(1)} flags: {sorted(unknown)}"


def test_healthchecks_ask_readyz() -> None:
    """A python one-liner (python is in the image) that asks the service's /readyz on its
    metrics port: it passes on 200 and fails on 503 (up, not ready) and on a closed port."""
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        ready = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/readyz" and Ready.ready
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    for name, args in [(n, _node(n)) for n in NODES] + [("gateway", _gateway())]:
        test = _service(name)["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"] and test[4] == str(args.metrics_port), name
        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready) as server:
            port = str(server.server_address[1])
            threading.Thread(target=server.serve_forever, daemon=True).start()
            Ready.ready = True
            ready = subprocess.run([sys.executable, "-c", test[3], port],
                                   capture_output=True, timeout=30)
            Ready.ready = False
            not_ready = subprocess.run([sys.executable, "-c", test[3], port],
                                       capture_output=True, timeout=30)
            server.shutdown()
        down = subprocess.run([sys.executable, "-c", test[3], port], capture_output=True,
                              timeout=30)
        assert ready.returncode == 0, (name, ready.stderr)
        assert not_ready.returncode != 0 and down.returncode != 0, name


def test_the_build_context_is_what_the_image_copies() -> None:
    """The root's .dockerignore lets in what the Dockerfile copies and nothing else."""
    rules = [r for r in (REPO / ".dockerignore").read_text().splitlines()
             if r and not r.startswith("#")]
    assert rules[0] == "*"
    copied = {rest.split()[0] for instruction, rest in _dockerfile() if instruction == "COPY"}
    assert {r[1:] for r in rules if r.startswith("!")} == copied


def test_the_readme_names_the_dockerfile_where_it_is() -> None:
    text = (DEPLOY / "README.md").read_text()
    assert "deploy/Dockerfile" in text and "at the repository root" not in text
    assert not re.search(r"\bissue \d+", text, re.IGNORECASE)


# -- the image -------------------------------------------------------------------------------

def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), " ".join(rest.split())))
    return out


def test_dockerfile_installs_the_repository() -> None:
    steps = _dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    copied = {rest.split()[0] for instruction, rest in steps if instruction == "COPY"}
    assert {"pyproject.toml", "src", "proto"} <= copied
    assert all((REPO / path).exists() for path in copied)
    (run,) = [rest for instruction, rest in steps if instruction == "RUN"]
    # the same protoc invocation as the Makefile's $(GEN) rule, before the package is built
    make = re.search(r"grpc_tools\.protoc (.*?) \$\(PROTOS\)", (REPO / "Makefile").read_text())
    assert make, "the Makefile's protoc rule moved"
    protoc = run.index(f"python -m grpc_tools.protoc {make.group(1)} proto/sqsq/v1/*.proto")
    final = run.index("pip install --no-deps --force-reinstall .")
    assert run.index("pip install .") < protoc < final
    entrypoint = [json.loads(rest) for instruction, rest in steps if instruction == "ENTRYPOINT"]
    assert entrypoint == [["sqsq"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "sqsq" in scripts


# -- metrics: Prometheus and the Grafana dashboard -------------------------------------------

def _prometheus_targets() -> dict[str, set[str]]:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
            for job in config["scrape_configs"]}


def dashboard_metric_names(deploy: Path = DEPLOY) -> set[str]:
    """The sqsq metric names every query of the Grafana dashboard uses."""
    dashboard = json.loads((deploy / "grafana" / "dashboards" / "sqsq.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs, "the dashboard has no queries"
    return {name for e in exprs for name in re.findall(r"\bsqsq_[a-z0-9_]+", e)}


def test_prometheus_scrapes_every_sqsq_process() -> None:
    """Each node and the gateway serve metrics on the port the scrape config names, and
    expose it on the compose network."""
    targets = _prometheus_targets()
    expected = {"sqsq-node": {f"{n}:{_node(n).metrics_port}" for n in NODES},
                "sqsq-gateway": {f"gateway:{_gateway().metrics_port}"}}
    assert targets == expected
    for name in (*NODES, "gateway"):
        args = _node(name) if name in NODES else _gateway()
        assert args.metrics_port is not None, f"{name} serves no metrics"
        assert args.metrics_port in _expose(_service(name)), f"{name}: metrics port not exposed"
        assert args.log_format == "json", f"{name}: logs for a collector are JSON lines"
    prometheus = _service("prometheus")
    mounts = {target: source for source, target, *_ in
              (str(v).split(":") for v in prometheus["volumes"])}
    config = mounts["/etc/prometheus/prometheus.yml"]
    assert (DEPLOY / config).resolve() == DEPLOY / "prometheus" / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    grafana = _service("grafana")
    mounts = {target: (DEPLOY / source).resolve() for source, target, *_ in
              (str(v).split(":") for v in grafana["volumes"]) if source.startswith(".")}
    provisioning = mounts["/etc/grafana/provisioning"]
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "sqsq.yml").read_text())
    (dashboards,) = provider["providers"]
    assert mounts[dashboards["options"]["path"]] == DEPLOY / "grafana" / "dashboards"
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "sqsq.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}, "every query reads the provisioned Prometheus"
    jobs = {j for p in dashboard["panels"] for t in p["targets"]
            for j in re.findall(r'job="([^"]+)"', t["expr"])}
    assert jobs <= set(_prometheus_targets()), jobs


def test_dashboard_queries_name_metrics_that_exist(cluster) -> None:  # noqa: ANN001 - conftest's
    """Every metric the dashboard queries is in a real scrape of a cluster's nodes and
    gateway (parsed with Prometheus' own parser)."""
    from ops.opssupport import scrape

    c = cluster.cluster
    names: set[str] = set()
    for url in (c.gateway.metrics_url, *(n.metrics_url for n in c.nodes)):
        names |= scrape(url).names()
    wanted = dashboard_metric_names()
    assert len(wanted) >= 10
    assert wanted <= names, sorted(wanted - names)
