# `make run`, `make test` and `make report` set everything up themselves, idempotently.
# `make run` installs only what the server needs (`make server-setup`: .venv, the package, the
# generated gRPC code); `make setup` adds the test, benchmark and analytics tools (pytest,
# boto3, the aws CLI, Celery, Spark, Java) that `make test`, `make report` and `make bench` use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BASE := $(VENV)/.installed-server
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/sqsq/v1/*.proto)
GEN := src/sqsq/v1/.generated

.PHONY: setup server-setup system-deps run cluster test chaos simulate lint clean bench report

setup: system-deps $(STAMP) $(GEN)

server-setup: $(BASE) $(GEN)

# Java runs the Spark analytics (jobs and tests). Installed when missing (we are root on the
# machines this targets); if that fails, the analytics tests fail loudly, they never skip.
# etcd (Debian's etcd-server 3.4) holds the cluster's partition map; the control-plane tests
# start a real one and fail (never skip) without it.
# iptables (with iproute2's `ip netns`) makes the chaos tests' network partitions inside
# namespaces of their own; without it system-deps fails, and so would those tests.
# Chromium and its driver (Debian's chromium, chromium-driver) run the web console's browser
# test (tests/console, Selenium pointed at /usr/bin); without them that test fails, never skips.
system-deps:
	@command -v java >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless; } \
		|| echo "WARNING: could not install Java 17: the Spark analytics tests will fail"
	@command -v etcd >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; } \
		|| echo "WARNING: could not install etcd-server: the control-plane tests will fail"
	@{ command -v iptables && command -v ip; } >/dev/null 2>&1 || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables iproute2; } \
		|| { echo "ERROR: could not install iptables/iproute2: the chaos tests need them" >&2; \
		     exit 1; }
	@{ test -x /usr/bin/chromium && test -x /usr/bin/chromedriver; } || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } \
		|| echo "WARNING: could not install chromium/chromium-driver: the console's browser test will fail"

$(BASE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(BASE)

$(STAMP): $(BASE)
	$(PY) -m pip install -q -e '.[dev,analytics]'
	touch $(STAMP)

$(GEN): $(PROTOS) $(BASE)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=src --grpc_python_out=src --pyi_out=src $(PROTOS)
	touch $(GEN)

run: server-setup
	$(VENV)/bin/sqsq server --data-dir ./data

# A local cluster in the foreground: etcd, three nodes holding four shards of three replicas,
# and a gateway on 7400 (gRPC) and 9324 (SQS HTTP); Ctrl-C stops it. ./cluster keeps it: the
# next `make cluster` starts the same cluster again, with its queues and messages.
cluster: server-setup system-deps
	@echo "make cluster: etcd, 3 nodes, 4 shards of 3 replicas, a gateway on 7400/9324, in ./cluster"
	$(VENV)/bin/sqsq cluster up --dir ./cluster

# Three pytest workers (pytest-xdist): most tests wait on servers, elections and timeouts, so
# three keep two cores busy. A file's tests stay on one worker (its fixtures start once); the
# network-namespace tests and the Spark tests each keep to one worker (tests/conftest.py).
# TEST_WORKERS=0 runs them all in this process. Tests marked `alone` (a wall-clock bound that
# the others' load would stretch) run afterwards, on their own.
TEST_WORKERS ?= 3
test: setup
	$(PY) -m ruff check src tests spark_jobs bench
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not alone"
	$(PY) -m pytest -q -m alone

# Every chaos scenario (faults under load in network namespaces, each message checked); a
# short form runs in `make test`. One scenario: PYTHONPATH=tests $(PY) -m chaos.chaosrun
# --scenario NAME --seconds N --seed S. Writes the table to docs/chaos.md.
chaos: setup
	PYTHONPATH=tests $(PY) -m chaos.chaosrun --seconds 60 --write-doc docs/chaos.md

# The deterministic simulator of replication (sqsq.sim) over more seeds than `make test` runs:
# every scenario, SEEDS seeds each (default 200), two processes. A failing run prints the one
# command that replays it.
SEEDS ?= 200
simulate: server-setup
	$(PY) -m sqsq.sim --seeds $(SEEDS) --jobs 2

# Benchmarks against peers (installs NATS, RabbitMQ, moto first); prints, writes JSON and PNGs.
bench: setup
	PY=$(PY) bash bench/install_peers.sh
	$(PY) -m bench --all

# Snapshot the running local server (make run) and build both Spark reports from it.
report: setup
	$(VENV)/bin/sqsq export --out ./snapshots --endpoint $${SQSQ_ENDPOINT:-127.0.0.1:7400}
	$(PY) spark_jobs/backlog_report.py --input ./snapshots --out ./reports/backlog
	$(PY) spark_jobs/dlq_analytics.py --input ./snapshots --out ./reports/dlq

lint: setup
	$(PY) -m ruff check src tests spark_jobs bench

clean:
	rm -rf $(VENV) src/sqsq/v1/*_pb2*.py src/sqsq/v1/*_pb2*.pyi
