"""One line per network mishap, rate-limited: clients that hang up mid-request and malformed
HTTP are the internet's weather, not server errors; a traceback each floods the log."""

from __future__ import annotations

import logging
import time
from collections import Counter

from aiohttp.http_exceptions import HttpProcessingError

# What the network does to a server: not bugs, so no tracebacks. Anything else logs in full.
MISHAPS: tuple[type[BaseException], ...] = (ConnectionError, HttpProcessingError, TimeoutError)

# At most this many lines per kind of mishap per window; the rest are counted and the count
# is reported with the next line that gets through.
LINES_PER_WINDOW = 5
WINDOW_S = 60.0

# Every mishap seen in this process, shown or suppressed, by kind (the exception's type name,
# or the ``mishap_kind`` a record was logged with): exported as sqsq_client_mishaps_total.
COUNTS: Counter[str] = Counter()


class OneLineRateLimited(logging.Filter):
    """A record about a network mishap (its exception is one of ``MISHAPS``, or it was logged
    with ``extra={"mishap": True}``) becomes one line (``message: ExcType: text``), and at most
    ``LINES_PER_WINDOW`` of each message template get through per ``WINDOW_S``."""

    def __init__(self, clock=time.monotonic) -> None:  # noqa: ANN001 - a () -> float
        super().__init__()
        self.clock = clock
        self.windows: dict[str, tuple[float, int, int]] = {}  # msg -> (start, shown, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        mishap = isinstance(exc, MISHAPS) or getattr(record, "mishap", False)
        if not mishap:
            return True  # real errors keep their traceback and are never dropped
        COUNTS[getattr(record, "mishap_kind", None) or
               (type(exc).__name__ if exc is not None else "other")] += 1
        now = self.clock()
        start, shown, dropped = self.windows.get(str(record.msg), (now, 0, 0))
        if now - start >= WINDOW_S:
            start, shown = now, 0
        if shown >= LINES_PER_WINDOW:
            self.windows[str(record.msg)] = (start, shown, dropped + 1)
            return False
        self.windows[str(record.msg)] = (start, shown + 1, 0)
        if len(self.windows) > 1000:  # bounded: forget the oldest kinds
            for key in list(self.windows)[:500]:
                del self.windows[key]
        if exc is not None:
            detail = str(exc).splitlines()[0][:200] if str(exc) else ""
            record.msg = f"{record.getMessage()}: {type(exc).__name__}" + (
                f": {detail}" if detail else "")
            record.args = None
            record.exc_info = None
            record.exc_text = None
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} similar suppressed)"
            record.args = None
        return True


def install(*logger_names: str) -> None:
    """Filter these loggers (idempotent)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineRateLimited) for f in logger.filters):
            logger.addFilter(OneLineRateLimited())
