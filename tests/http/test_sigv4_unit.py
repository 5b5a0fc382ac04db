"""SigV4 verification against botocore's signer, without a server: canonical paths, query
strings, clock skew, tampering; and the gRPC token."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sqsq.gateway.auth import Authenticator, AuthError, SignedRequest, grpc_token, load_credentials

KEY, SECRET = "AKIDUNIT", "unit-secret"


def _signed(method: str, url: str, body: bytes = b"", secret: str = SECRET) -> SignedRequest:
    req = AWSRequest(method=method, url=url, data=body,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    signer = SigV4Auth(Credentials(KEY, secret), "sqs", "eu-west-1")
    signer.add_auth(req)
    prepared = req.prepare()
    parts = urlsplit(prepared.url)
    headers = {k.lower(): v for k, v in prepared.headers.items()}
    headers["host"] = parts.netloc
    return SignedRequest(method, parts.path or "/", parts.query,
                         lambda name: [headers[name]] if name in headers else [],
                         prepared.body or b"")


@pytest.mark.parametrize("method,url,body", [
    ("POST", "http://127.0.0.1:9324/", b'{"QueueName":"a"}'),
    ("GET", "http://127.0.0.1:9324/000000000000/q-1?Action=ListQueues&QueueNamePrefix=a%20b~c",
     b""),
    ("POST", "http://localhost:1/000000000000/odd%20name/", b"Action=SendMessage&MessageBody=x"),
])
def test_botocore_signatures_verify(method: str, url: str, body: bytes) -> None:
    assert Authenticator({KEY: SECRET}).verify_sigv4(_signed(method, url, body)) == KEY


def test_rejections() -> None:
    auth = Authenticator({KEY: SECRET})
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        auth.verify_sigv4(_signed("POST", "http://h:1/", b"x", secret="other"))
    good = _signed("POST", "http://h:1/", b"original")
    tampered = SignedRequest(good.method, good.raw_path, good.raw_query, good.headers, b"changed")
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        auth.verify_sigv4(tampered)
    late = Authenticator({KEY: SECRET}, clock=lambda: time.time() + 3600)  # an hour later
    with pytest.raises(AuthError, match="SignatureDoesNotMatch.*expired"):
        late.verify_sigv4(good)
    with pytest.raises(AuthError, match="InvalidClientTokenId"):
        Authenticator({"OTHER": SECRET}).verify_sigv4(good)
    with pytest.raises(AuthError, match="MissingAuthenticationToken"):
        auth.verify_sigv4(SignedRequest("POST", "/", "", lambda name: [], b""))
    # Open server: nothing is checked.
    assert Authenticator({}).verify_sigv4(tampered) is None


def test_grpc_token_window() -> None:
    now = 1_800_000_000.0
    auth = Authenticator({KEY: SECRET}, clock=lambda: now)
    assert auth.verify_grpc_token(grpc_token(KEY, SECRET, "/m", now=now - 60), "/m") == KEY
    with pytest.raises(AuthError, match="expired"):
        auth.verify_grpc_token(grpc_token(KEY, SECRET, "/m", now=now - 600), "/m")
    with pytest.raises(AuthError, match="IncompleteSignature"):
        auth.verify_grpc_token("Bearer nonsense", "/m")


def test_load_credentials(tmp_path) -> None:  # noqa: ANN001
    plain = tmp_path / "plain"
    plain.write_text("# comment\nA1 s1\nA2:s2\n\nA3=s3\n")
    env = {"SQSQ_ACCESS_KEY_ID": "E", "SQSQ_SECRET_ACCESS_KEY": "es"}
    assert load_credentials(str(plain), env) == {"A1": "s1", "A2": "s2", "A3": "s3", "E": "es"}
    assert load_credentials(None, {"SQSQ_CREDENTIALS_FILE": str(plain)})["A2"] == "s2"
    assert load_credentials(None, {}) == {}
    with pytest.raises(ValueError):
        load_credentials(None, {"SQSQ_ACCESS_KEY_ID": "only-the-id"})


def _presigned(url: str, expires: int = 300, secret: str = SECRET) -> SignedRequest:
    req = AWSRequest(method="GET", url=url)
    SigV4QueryAuth(Credentials(KEY, secret), "sqs", "eu-west-1", expires=expires).add_auth(req)
    parts = urlsplit(req.prepare().url)
    return SignedRequest("GET", parts.path or "/", parts.query,
                         lambda name: [parts.netloc] if name == "host" else [], b"")


def test_presigned_urls() -> None:
    url = "http://127.0.0.1:9324/000000000000/q?Action=ReceiveMessage&MaxNumberOfMessages=2"
    auth = Authenticator({KEY: SECRET})
    good = _presigned(url)
    assert "X-Amz-Signature=" in good.raw_query and "Authorization" not in good.raw_query
    assert auth.verify_sigv4(good) == KEY
    tampered = SignedRequest("GET", good.raw_path,
                             good.raw_query.replace("MaxNumberOfMessages=2",
                                                    "MaxNumberOfMessages=9"),
                             good.headers, b"")
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        auth.verify_sigv4(tampered)
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        auth.verify_sigv4(_presigned(url, secret="other"))
    # Valid for X-Amz-Expires seconds from X-Amz-Date, and no longer.
    later = Authenticator({KEY: SECRET}, clock=lambda: time.time() + 400)
    with pytest.raises(AuthError, match="AccessDenied.*expired"):
        later.verify_sigv4(good)
    assert later.verify_sigv4(_presigned(url, expires=600)) == KEY
    with pytest.raises(AuthError, match="AuthorizationQueryParametersError"):
        auth.verify_sigv4(_presigned(url, expires=8 * 24 * 3600))
    cut = SignedRequest("GET", good.raw_path,
                        "&".join(p for p in good.raw_query.split("&")
                                 if not p.startswith("X-Amz-Credential=")),
                        good.headers, b"")
    with pytest.raises(AuthError, match="IncompleteSignature.*X-Amz-Credential"):
        auth.verify_sigv4(cut)
