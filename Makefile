# `make run` and `make test` set everything up themselves; `make setup` is the shared,
# idempotent part: .venv, the package and its dependencies, the generated gRPC code.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO := proto/sqsq/v1/queues.proto
GEN := src/sqsq/v1/queues_pb2.py

.PHONY: setup run test lint clean bench

setup: $(STAMP) $(GEN)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,analytics]'
	touch $(STAMP)

$(GEN): $(PROTO) $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=src --grpc_python_out=src --pyi_out=src $(PROTO)
	touch $(GEN)

run: setup
	$(VENV)/bin/sqsq server --data-dir ./data

test: setup
	$(PY) -m ruff check src tests
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check src tests

clean:
	rm -rf $(VENV) src/sqsq/v1/*_pb2*.py src/sqsq/v1/*_pb2*.pyi
