"""The SQS-compatible HTTP API (AWS JSON 1.0 and query protocols) over ``QueueService``."""

from sqsq.gateway.http.app import make_app
from sqsq.gateway.http.runner import AppRunner

__all__ = ["AppRunner", "make_app"]
