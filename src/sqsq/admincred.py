"""The admin credential: what a caller of the Admin gRPC service (snapshots and the
receipt-handle secret, the partition map, replica status, peek) must prove it holds.

The Admin service reveals messages and the cluster secret (which signs receipt handles and
keys the Raft transport), so it is never open, also when the queue API is: ``sqsq server``
and ``sqsq cluster up`` make a credential (``admin-token``, 0600, in the data or cluster
directory) and every process that serves or calls the Admin service reads it:

1. env ``SQSQ_ADMIN_TOKEN`` (the value itself), else
2. env ``SQSQ_ADMIN_TOKEN_FILE`` (a file holding it), else
3. ``admin-token`` in the directory the process is given (a server or node makes it there
   when it is missing).

The credential never travels: each call carries metadata ``sqsq-admin`` =
``<unix time>:<HMAC-SHA256(credential, "sqsq-admin-v1\\n<time>\\n<method>")>``, so a captured
value replays only the same method for a few minutes. Both the SDK-side tools (``sqsq
backup``, ``cluster status --replicas``, ``sqsq export``) and the servers import this
module; it imports no server code.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from sqsq.wire import ADMIN_METADATA_KEY

ENV_TOKEN = "SQSQ_ADMIN_TOKEN"
ENV_TOKEN_FILE = "SQSQ_ADMIN_TOKEN_FILE"
FILE_NAME = "admin-token"
MIN_BYTES = 32  # as for the cluster secret: a shorter key is guessable
MAX_SKEW_S = 5 * 60


class CredentialError(ValueError):
    """A credential or secret file that must not be used: says which file and how to fix it."""


def check_length(data: bytes, path: Path | str, what: str) -> bytes:
    """``data`` (read from ``path``) if it is long enough to be a key; else a clear error."""
    if len(data) < MIN_BYTES:
        raise CredentialError(
            f"{path}: the {what} is {len(data)} bytes, fewer than {MIN_BYTES}: too short to "
            f"be a key. Make one with `head -c 32 /dev/urandom > {path}; chmod 600 {path}` "
            f"(or remove it and let sqsq make one)")
    return data


def _read(path: Path) -> bytes:
    return check_length(path.read_bytes().strip(), path, "admin credential")


def ensure(directory: Path) -> Path:
    """``directory/admin-token``, made (64 hex characters, mode 0600) if missing."""
    path = Path(directory) / FILE_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile: theirs stands
            return path
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return path


def load(directory: Path | None = None, env: Mapping[str, str] | None = None, *,
         create: bool = False) -> bytes | None:
    """The credential by the rules above; ``None`` when there is none (and not ``create``)."""
    env = os.environ if env is None else env
    if env.get(ENV_TOKEN):
        return check_length(env[ENV_TOKEN].strip().encode(), f"${ENV_TOKEN}",
                            "admin credential")
    if env.get(ENV_TOKEN_FILE):
        return _read(Path(env[ENV_TOKEN_FILE]))
    if directory is None:
        return None
    path = Path(directory) / FILE_NAME
    if create:
        ensure(Path(directory))
    return _read(path) if path.exists() else None


def for_children(env: dict[str, str], directory: Path) -> None:
    """Make sure the processes started with ``env`` share one credential: the one in
    ``env`` if there is one, else ``directory/admin-token`` (made if missing)."""
    if not _names_one(env):
        env[ENV_TOKEN_FILE] = str(ensure(directory).resolve())


_chosen_here: str | None = None  # what use_directory last put in the env


def _names_one(env: Mapping[str, str]) -> bool:
    """Whether ``env`` names a credential of its own: one ``use_directory`` chose for an
    earlier directory does not count, so a process that runs one cluster after another (a
    bench) follows each rather than the first, deleted with its directory by then."""
    return bool(env.get(ENV_TOKEN)) or env.get(ENV_TOKEN_FILE) not in (None, "", _chosen_here)


def use_directory(directory: Path) -> None:
    """A tool given a server's or a cluster's directory: use its credential unless the env
    names one (``_names_one``)."""
    global _chosen_here
    path = Path(directory) / FILE_NAME
    if not _names_one(os.environ) and path.exists():
        _chosen_here = os.environ[ENV_TOKEN_FILE] = str(path.resolve())


# ---- proof -----------------------------------------------------------------------------


def _mac(key: bytes, ts: int, method: str) -> str:
    return hmac.new(key, f"sqsq-admin-v1\n{ts}\n{method}".encode(), hashlib.sha256).hexdigest()


def token(key: bytes, method: str, now: float | None = None) -> str:
    ts = int(time.time() if now is None else now)
    return f"{ts}:{_mac(key, ts, method)}"


def verify(key: bytes | None, value: str | None, method: str,
           now: float | None = None) -> bool:
    """Whether ``value`` proves the caller holds ``key`` for ``method`` (never with no key)."""
    if not key or not value:
        return False
    ts, _, mac = value.partition(":")
    if not ts.isdigit():
        return False
    if abs((time.time() if now is None else now) - int(ts)) > MAX_SKEW_S:
        return False
    return hmac.compare_digest(_mac(key, int(ts), method), mac)


def metadata(key: bytes | None, method: str) -> tuple[tuple[str, str], ...]:
    """The metadata an Admin call to ``method`` carries (none without a key)."""
    return ((ADMIN_METADATA_KEY, token(key, method)),) if key else ()


class _Signer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _details(self, details: Any) -> Any:
        return _Details(details, metadata(self._key, details.method))

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, extra: tuple[tuple[str, str], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = tuple(base.metadata or ()) + extra
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def signing(channel: grpc.Channel, key: bytes | None = None) -> grpc.Channel:
    """``channel`` with every call signed with ``key`` (default: by the rules above)."""
    key = key if key is not None else load()
    return channel if not key else grpc.intercept_channel(channel, _Signer(key))
