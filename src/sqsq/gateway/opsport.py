"""The operations port (``--metrics-port``): what a scraper and an orchestrator ask a process,
on a port of its own so that neither competes with clients nor needs their credentials.

- ``GET /metrics``: Prometheus exposition of the process's own registry (text, or
  OpenMetrics when the scraper asks for it).
- ``GET /healthz``: 200 while the process's event loop answers (``{"alive": true}``).
- ``GET /readyz``: 200 ``{"ready": true, "problems": []}`` when the process can serve, else
  503 with each thing that is not ready, one sentence each (what "ready" means is the
  composer's: ``sqsq server``, ``sqsq node`` and ``sqsq gateway`` each pass their check).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sqsq.gateway.http import quietlog
from sqsq.gateway.http.runner import AppRunner

log = logging.getLogger("sqsq.ops")

# What is not ready, one sentence each; empty when ready.
Readiness = Callable[[], Awaitable[list[str]]]
READY_CHECK_TIMEOUT_S = 5.0  # a check that hangs is itself a problem, reported as one


@dataclass
class OpsPort:
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


def make_ops_app(registry: CollectorRegistry, readiness: Readiness) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        # Off the event loop: with thousands of queues a scrape takes a good fraction of a
        # second of reads (docs/operations.md), which clients must not wait behind.
        body = await asyncio.to_thread(encode, registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readyz(request: web.Request) -> web.Response:
        try:
            problems = await asyncio.wait_for(readiness(), READY_CHECK_TIMEOUT_S)
        except TimeoutError:
            problems = [f"the readiness check did not finish within "
                        f"{READY_CHECK_TIMEOUT_S:g} s"]
        except Exception as exc:  # noqa: BLE001 - a failing check means not ready, said why
            log.exception("readiness check failed")
            problems = [f"the readiness check failed: {exc}"]
        return web.json_response({"ready": not problems, "problems": problems},
                                 status=503 if problems else 200)

    quietlog.install("aiohttp.server")
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_ops_port(host: str, port: int, registry: CollectorRegistry,
                         readiness: Readiness) -> OpsPort:
    """Listen on ``host:port`` (0: any free port; the bound one is returned)."""
    runner = AppRunner(make_ops_app(registry, readiness), access_log=None,
                       shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen for metrics on {host}:{port}: {exc.strerror}") from None
    return OpsPort(runner, runner.addresses[0][1])
