"""Who may call: credentials, SigV4 verification for HTTP, and a signed token for gRPC.

One credential store locks both doors. Without credentials the server runs open.

Credentials come from a file (``--credentials FILE`` or env ``SQSQ_CREDENTIALS_FILE``) and/or
the env pair ``SQSQ_ACCESS_KEY_ID`` + ``SQSQ_SECRET_ACCESS_KEY``. The file is either an AWS
shared-credentials INI file (``aws_access_key_id`` / ``aws_secret_access_key`` per section)
or plain lines ``ACCESS_KEY_ID SECRET`` (also ``:`` or ``=`` separated; ``#`` comments).

gRPC token (metadata ``authorization``): made by the SDK, its format in ``sqsq.wire``; verified
here.
"""

from __future__ import annotations

import configparser
import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote

import grpc

from sqsq.core import regions
from sqsq.wire import (  # noqa: F401 - the token format is shared with the SDK
    ENV_KEY_ID,
    ENV_SECRET,
    ERROR_CODE_KEY,
    GRPC_METADATA_KEY,
    GRPC_SCHEME,
    grpc_signature,
    grpc_token,
)

ENV_FILE = "SQSQ_CREDENTIALS_FILE"
MAX_SKEW_S = 15 * 60  # what AWS allows between the signer's clock and ours
GRPC_MAX_SKEW_S = 5 * 60
MAX_PRESIGNED_S = 7 * 24 * 3600  # SigV4's longest presigned URL


@dataclass
class AuthError(Exception):
    """An authentication failure, as SQS reports it (always the sender's fault)."""

    code: str
    message: str
    http_status: int = 403
    grpc_status: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def _missing() -> AuthError:
    return AuthError("MissingAuthenticationToken",
                     "Request is missing Authentication Token")


def _unknown_key() -> AuthError:
    return AuthError("InvalidClientTokenId",
                     "The security token included in the request is invalid.")


def _bad_signature(detail: str = "") -> AuthError:
    return AuthError(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your AWS Secret Access Key and signing method." + (f" {detail}" if detail else ""))


# ---- loading ---------------------------------------------------------------------------


def _parse_file(text: str) -> dict[str, str]:
    if re.search(r"^\s*\[", text, re.MULTILINE):
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        out = {}
        for section in parser.sections():
            s = parser[section]
            if "aws_access_key_id" in s and "aws_secret_access_key" in s:
                out[s["aws_access_key_id"].strip()] = s["aws_secret_access_key"].strip()
        return out
    out = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"\s*[:=\s]\s*", line, maxsplit=1)
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"credentials file line {lineno}: expected 'KEY_ID SECRET'")
        out[parts[0]] = parts[1]
    return out


def load_credentials(
    path: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """access key id -> secret from the file (argument, else env) and the env pair."""
    env = os.environ if env is None else env
    creds: dict[str, str] = {}
    path = path or env.get(ENV_FILE) or None
    if path:
        creds.update(_parse_file(Path(path).read_text()))
    key_id, secret = env.get(ENV_KEY_ID), env.get(ENV_SECRET)
    if bool(key_id) != bool(secret):
        raise ValueError(f"set both {ENV_KEY_ID} and {ENV_SECRET}, or neither")
    if key_id and secret:
        creds[key_id] = secret
    return creds


# ---- SigV4 -----------------------------------------------------------------------------

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-fA-F]+)\s*$")


def _quote(text: str) -> str:
    return quote(text, safe="-_.~")


def _canonical_query(raw_query: str) -> str:
    pairs = []
    for part in raw_query.split("&") if raw_query else ():
        key, _, value = part.partition("=")
        key, value = unquote(key.replace("+", " ")), unquote(value.replace("+", " "))
        if key == "X-Amz-Signature":
            continue
        pairs.append((_quote(key), _quote(value)))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _canonical_path(raw_path: str) -> str:
    # SigV4 for every service but S3: normalize, then encode the (already encoded) path again.
    segments: list[str] = []
    for seg in raw_path.split("/"):
        if seg == "..":
            if segments:
                segments.pop()
        elif seg and seg != ".":
            segments.append(seg)
    path = "/" + "/".join(segments) + ("/" if segments and raw_path.endswith("/") else "")
    return quote(path, safe="/~")


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


@dataclass(frozen=True)
class SignedRequest:
    """What SigV4 covers: method, raw path and query, headers (all values), body."""

    method: str
    raw_path: str
    raw_query: str
    headers: Callable[[str], list[str]]  # lowercase name -> every value sent
    body: bytes


@dataclass(frozen=True)
class _SignatureParams:
    """Where a request says it was signed: the same fields in a header or a presigned URL."""

    credential: str
    signed_headers: str
    signature: str
    amz_date: str
    expires_s: int = 0  # presigned URLs only


def _header_params(req: SignedRequest) -> _SignatureParams:
    auth = (req.headers("authorization") or [""])[0]
    if not auth:
        raise _missing()
    m = _AUTH_RE.match(auth.strip())
    if m is None:
        raise AuthError("IncompleteSignature", "Authorization header is malformed.", 400)
    return _SignatureParams(m["cred"], m["signed"], m["sig"],
                            (req.headers("x-amz-date") or [""])[0])


def _presigned_params(raw_query: str) -> _SignatureParams | None:
    params = dict(parse_qsl(raw_query, keep_blank_values=True))
    if "X-Amz-Signature" not in params and "X-Amz-Algorithm" not in params:
        return None
    missing = [k for k in ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date",
                           "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature")
               if not params.get(k)]
    if missing:
        raise AuthError("IncompleteSignature",
                        f"The presigned URL lacks {', '.join(missing)}.", 400)
    if params["X-Amz-Algorithm"] != "AWS4-HMAC-SHA256":
        raise AuthError("IncompleteSignature", "Only AWS4-HMAC-SHA256 is supported.", 400)
    expires = params["X-Amz-Expires"]
    if not expires.isdigit() or not 1 <= int(expires) <= MAX_PRESIGNED_S:
        raise AuthError("AuthorizationQueryParametersError",
                        f"X-Amz-Expires must be between 1 and {MAX_PRESIGNED_S} seconds.", 400)
    return _SignatureParams(params["X-Amz-Credential"], params["X-Amz-SignedHeaders"],
                            params["X-Amz-Signature"], params["X-Amz-Date"], int(expires))


def signing_region(req: SignedRequest) -> str | None:
    """The region a request is signed for (its credential scope), None when unsigned. Read
    whether or not signatures are checked: the region names the caller's queues."""
    credential = None
    if "X-Amz-Credential" in req.raw_query:  # a presigned URL
        credential = dict(parse_qsl(req.raw_query, keep_blank_values=True)).get(
            "X-Amz-Credential")
    if credential is None:
        m = _AUTH_RE.match((req.headers("authorization") or [""])[0].strip())
        credential = m["cred"] if m else ""
    scope = credential.split("/")
    if len(scope) != 5:
        return None
    if not regions.valid_region(scope[2]):  # as Amazon answers a made-up region
        raise _bad_signature(f"Credential should be scoped to a valid region, not "
                             f"'{scope[2]}'.")
    return scope[2]


class Authenticator:
    """Checks requests against the configured credentials; open when there are none."""

    def __init__(self, credentials: Mapping[str, str], clock: Callable[[], float] = time.time):
        self.credentials = dict(credentials)
        self.clock = clock

    @property
    def open(self) -> bool:
        return not self.credentials

    def verify_sigv4(self, req: SignedRequest) -> str | None:
        """The caller's access key id, or raise ``AuthError``. ``None`` when open.

        The signature comes in the ``Authorization`` header, or in the query string of a
        presigned URL (``X-Amz-Signature``, valid for ``X-Amz-Expires`` seconds)."""
        if self.open:
            return None
        presigned = _presigned_params(req.raw_query)
        sig = presigned or _header_params(req)
        cred = sig.credential.split("/")
        if len(cred) != 5 or cred[4] != "aws4_request":
            raise AuthError("IncompleteSignature", "Credential scope is malformed.", 400)
        key_id, date, region, service = cred[:4]
        secret = self.credentials.get(key_id)
        if secret is None:
            raise _unknown_key()
        try:
            signed_at = datetime.strptime(sig.amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            raise _bad_signature("X-Amz-Date is missing or malformed.") from None
        if not sig.amz_date.startswith(date):
            raise _bad_signature("The credential scope date does not match X-Amz-Date.")
        age = self.clock() - signed_at.timestamp()
        if presigned is None and abs(age) > MAX_SKEW_S:
            raise _bad_signature("Signature expired: the request time is too far from now.")
        if presigned is not None and not -MAX_SKEW_S <= age <= presigned.expires_s:
            raise AuthError("AccessDenied", "Request has expired.")
        signed = sig.signed_headers.lower().split(";")
        if "host" not in signed:
            raise _bad_signature("The host header must be signed.")
        canonical = "\n".join([
            req.method.upper(),
            _canonical_path(req.raw_path),
            _canonical_query(req.raw_query),
            "".join(f"{h}:{','.join(' '.join(v.split()) for v in req.headers(h))}\n"
                    for h in signed),
            ";".join(signed),
            hashlib.sha256(req.body).hexdigest(),  # always the real body: no unsigned payloads
        ])
        scope = f"{date}/{region}/{service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", sig.amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        expected = hmac.new(_signing_key(secret, date, region, service), to_sign.encode(),
                            hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, sig.signature.lower()):
            raise _bad_signature()
        return key_id

    def verify_grpc_token(self, token: str | None, method: str) -> str | None:
        if self.open:
            return None
        if not token:
            raise _missing()
        scheme, _, rest = token.partition(" ")
        parts = rest.split(":")
        if scheme != GRPC_SCHEME or len(parts) != 3 or not parts[1].isdigit():
            raise AuthError("IncompleteSignature", "The authorization token is malformed.", 400)
        key_id, ts, sig = parts
        secret = self.credentials.get(key_id)
        if secret is None:
            raise _unknown_key()
        if abs(self.clock() - int(ts)) > GRPC_MAX_SKEW_S:
            raise _bad_signature("Token expired.")
        if not hmac.compare_digest(grpc_signature(secret, key_id, int(ts), method), sig):
            raise _bad_signature()
        return key_id


class GrpcAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without a valid token before they reach the service."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        handler = await continuation(handler_call_details)
        if self.auth.open or handler is None:
            return handler
        token = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == GRPC_METADATA_KEY:
                token = value if isinstance(value, str) else value.decode()
        try:
            self.auth.verify_grpc_token(token, handler_call_details.method)
            return handler
        except AuthError as e:
            return _denying_handler(handler, e)


def _denying_handler(handler, error: AuthError):  # noqa: ANN001, ANN202
    async def deny(request, context):  # noqa: ANN001, ANN202
        await context.abort(error.grpc_status, error.message,
                            trailing_metadata=((ERROR_CODE_KEY, error.code),))

    kwargs = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
