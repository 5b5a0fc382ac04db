"""The web console at ``/console`` on the SQS HTTP port of ``sqsq server`` and ``sqsq gateway``:
queues with their depths, a queue's page (attributes, an hour's depth chart, a peek at its
oldest messages, purge and redrive behind a confirmation), the shard map.

``install`` adds its routes to the HTTP front's aiohttp app (ahead of the SQS catch-all) and
runs the depth sampler while the app runs. What it reads comes from a ``ConsoleSource``
(``sources``); how it looks and who may change what, from ``web``.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from sqsq.gateway.auth import Authenticator
from sqsq.gateway.console.sampler import DepthHistory, interval_from_env
from sqsq.gateway.console.sources import ClusterSource, ConsoleSource, LocalSource, NodeSource
from sqsq.gateway.console.web import ROOT, add_routes

__all__ = ["ROOT", "ClusterSource", "ConsoleSource", "LocalSource", "NodeSource", "install"]


def install(app: web.Application, source: ConsoleSource, auth: Authenticator) -> None:
    history = DepthHistory(interval_from_env())
    add_routes(app, source, auth, history)
    sampling: list[asyncio.Task] = []

    async def start(_: web.Application) -> None:
        sampling.append(asyncio.create_task(history.run(source.depths)))

    async def stop(_: web.Application) -> None:
        for task in sampling:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await source.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
