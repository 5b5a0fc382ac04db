"""The ``aws`` command line (installed from PyPI) against sqsq with ``--endpoint-url``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

AWS = shutil.which("aws", path=str(Path(sys.executable).parent)) or shutil.which("aws")


def aws(endpoint: str, *args: str) -> Any:
    assert AWS is not None, "the aws CLI (awscli, a dev dependency) is not installed"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_PAGER": ""}
    out = subprocess.run([AWS, "sqs", *args, "--endpoint-url", endpoint, "--output", "json"],
                         env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"aws sqs {args[0]} failed: {out.stderr}")
    return json.loads(out.stdout) if out.stdout.strip() else None


def test_aws_cli_create_send_receive_delete(sqs_endpoint: str) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    url = aws(sqs_endpoint, "create-queue", "--queue-name", name,
              "--attributes", "VisibilityTimeout=60")["QueueUrl"]
    assert url.endswith(f"/000000000000/{name}")
    assert url in aws(sqs_endpoint, "list-queues", "--queue-name-prefix", name)["QueueUrls"]
    sent = aws(sqs_endpoint, "send-message", "--queue-url", url, "--message-body", "from cli",
               "--message-attributes", '{"k": {"DataType": "String", "StringValue": "v"}}')
    assert sent["MessageId"]
    got = aws(sqs_endpoint, "receive-message", "--queue-url", url,
              "--message-attribute-names", "All", "--wait-time-seconds", "1")
    (m,) = got["Messages"]
    assert m["Body"] == "from cli" and m["MessageAttributes"]["k"]["StringValue"] == "v"
    aws(sqs_endpoint, "delete-message", "--queue-url", url, "--receipt-handle",
        m["ReceiptHandle"])
    attrs = aws(sqs_endpoint, "get-queue-attributes", "--queue-url", url,
                "--attribute-names", "ApproximateNumberOfMessages")
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
    aws(sqs_endpoint, "delete-queue", "--queue-url", url)


def test_readme_aws_command_works_as_written(sqs_endpoint: str, tmp_path: Path) -> None:
    """The README's `aws` example, run as a new user would: no AWS config of their own."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("sqs list-queues")[0].rsplit("```sh\n", 1)[1] + "sqs list-queues"
    command = block.replace("http://127.0.0.1:9324", sqs_endpoint).replace("\\\n", " ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_PAGER="")
    out = subprocess.run(["bash", "-c", command], cwd=Path(__file__).resolve().parents[2],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
