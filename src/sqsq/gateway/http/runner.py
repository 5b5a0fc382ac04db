"""``web.AppRunner`` whose answer to HTTP it cannot parse is a short fixed 400.

aiohttp answers a malformed request before any route or middleware sees it, with the parser's
message as the body, and that message quotes the offending bytes: 12 KB of garbage got 12 KB
back. aiohttp has no hook for that reply (aio-libs/aiohttp#3287), so its connection class is
replaced by one that keeps aiohttp's handling (logging, status, closing the connection) and
only drops the quoted text. The one log line is ``quietlog``'s business.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


def malformed_reply(status: int) -> str:
    return f"{status} {HTTPStatus(status).phrase}: malformed HTTP request\n"


class _ShortErrors(RequestHandler):
    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # Only a parse error comes with a message (the one that quotes the request); aiohttp's
        # own 500 and 504 texts say nothing about the request and are kept.
        if message is not None:
            message = malformed_reply(status)
        return super().handle_error(request, status, exc, message)


class _Server(web.Server):
    def __call__(self) -> RequestHandler:  # the protocol factory: one per connection
        return _ShortErrors(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The Application builds its Server itself; this is the same object, with the one
        # method that picks the connection class changed.
        server.__class__ = _Server
        return server
