"""Client side of gRPC authentication: a fresh signed token on every call.

Credentials are ``(access_key_id, secret)``, given explicitly or taken from the environment
(``SQSQ_ACCESS_KEY_ID`` / ``SQSQ_SECRET_ACCESS_KEY``, the same variables the server reads).
The secret never leaves the process: each call carries an HMAC over the key id, the time and
the method (see ``sqsq.wire``).
"""

from __future__ import annotations

import os
from typing import Any

import grpc
import grpc.aio

from sqsq.client._call import CHANNEL_OPTIONS
from sqsq.wire import ENV_KEY_ID, ENV_SECRET, GRPC_METADATA_KEY, grpc_token

Credentials = tuple[str, str]


def resolve(credentials: Credentials | None) -> Credentials | None:
    if credentials is not None:
        return credentials
    key_id, secret = os.environ.get(ENV_KEY_ID), os.environ.get(ENV_SECRET)
    return (key_id, secret) if key_id and secret else None


def _metadata(details: Any, credentials: Credentials) -> list[tuple[str, str]]:
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    return [*(details.metadata or ()), (GRPC_METADATA_KEY, grpc_token(*credentials, method))]


class _Details(grpc.ClientCallDetails):
    def __init__(self, details: Any, metadata: list[tuple[str, str]]) -> None:
        self.method, self.timeout, self.metadata = details.method, details.timeout, metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """For blocking channels (``grpc.intercept_channel``)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(_Details(details, _metadata(details, self.credentials)), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(_Details(details, _metadata(details, self.credentials)), request)


class AioTokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """For asyncio channels (``grpc.aio.insecure_channel(..., interceptors=[...])``)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    async def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return await continuation(grpc.aio.ClientCallDetails(
            details.method, details.timeout, _metadata(details, self.credentials),
            details.credentials, details.wait_for_ready), request)


def signed_channel(target: str, credentials: Credentials | None) -> grpc.Channel:
    """A blocking channel to ``target`` with the SDK's options; with credentials, a signed
    token on every call."""
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    if credentials is None:
        return channel
    return grpc.intercept_channel(channel, TokenInterceptor(credentials))


def signed_aio_channel(target: str, credentials: Credentials | None) -> grpc.aio.Channel:
    """``signed_channel`` for asyncio."""
    return grpc.aio.insecure_channel(
        target, options=CHANNEL_OPTIONS,
        interceptors=[AioTokenInterceptor(credentials)] if credentials else None)
