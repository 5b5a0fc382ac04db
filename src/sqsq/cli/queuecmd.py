"""The ``sqsq`` command's client side: queues and messages from the shell (``sqsq queue``,
``send``, ``receive``, ``delete``), each a handler of the parsed arguments and a ``Client``.
Output is text, or with ``--json`` SQS's own key names (``MessageId``, ``MD5OfBody``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from sqsq.client import Client, Message


def _pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{what} must look like NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def _emit(args: argparse.Namespace, data: Any, text: str | None) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=_json_default))
    elif text:
        print(text)


def _sqs_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A client dataclass as a dict with SQS's key names: message_id -> MessageId,
    md5_of_body -> MD5OfBody (nested maps, attribute names, are left as they are)."""
    def key(name: str) -> str:
        return "".join("MD5" if w == "md5" else w.capitalize() for w in name.split("_"))

    return {key(k): v for k, v in data.items()}


def _body(args: argparse.Namespace) -> str:
    """The message body: the argument, ``-`` for stdin, or ``--body-file``."""
    if args.body_file is not None:
        if args.body is not None:
            raise argparse.ArgumentTypeError("give the body or --body-file, not both")
        try:
            with open(args.body_file, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise argparse.ArgumentTypeError(f"--body-file: {e}") from None
    if args.body is None:
        raise argparse.ArgumentTypeError("a body is required: BODY, - for stdin, or --body-file")
    return sys.stdin.read() if args.body == "-" else args.body


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def cmd_queue_create(args: argparse.Namespace, client: Client) -> int:
    attributes = _pairs(args.attr, "--attr")
    name = args.name
    if args.fifo:
        attributes.setdefault("FifoQueue", "true")
        if not name.endswith(".fifo"):
            name += ".fifo"
    url = client.create_queue(name, attributes=attributes or None)
    _emit(args, {"QueueUrl": url}, url)
    return 0


def cmd_queue_list(args: argparse.Namespace, client: Client) -> int:
    urls = client.list_queues(queue_name_prefix=args.prefix or "")
    _emit(args, {"QueueUrls": urls}, "\n".join(urls))
    return 0


def cmd_queue_attrs(args: argparse.Namespace, client: Client) -> int:
    changes = _pairs(args.set, "--set")
    if changes:
        client.set_queue_attributes(args.name, changes)
    attrs = client.get_queue_attributes(args.name, ["All"])
    width = max((len(k) for k in attrs), default=0)
    text = "\n".join(f"{k.ljust(width)}  {attrs[k]}" for k in sorted(attrs))
    _emit(args, {"Attributes": attrs}, text)
    return 0


def cmd_queue_delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_queue(args.name)
    _emit(args, {"Deleted": args.name}, f"deleted {args.name}")
    return 0


def cmd_queue_purge(args: argparse.Namespace, client: Client) -> int:
    client.purge_queue(args.name)
    _emit(args, {"Purged": args.name}, f"purged {args.name}")
    return 0


def cmd_send(args: argparse.Namespace, client: Client) -> int:
    attrs = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in _pairs(args.attr, "--attr").items()
    }
    result = client.send_message(
        args.queue,
        _body(args),
        delay_seconds=args.delay,
        message_attributes=attrs or None,
        message_group_id=args.group,
        message_deduplication_id=args.dedup_id,
    )
    _emit(args, _sqs_keys(asdict(result)), result.message_id)
    return 0


def _format_message(m: Message) -> str:
    lines = [
        f"message {m.message_id}",
        f"  receive count:  {m.attributes.get('ApproximateReceiveCount', '?')}",
    ]
    group = m.attributes.get("MessageGroupId")
    if group:
        lines.append(f"  group:          {group}")
    for name in sorted(m.message_attributes):
        value = m.message_attributes[name]
        shown = value.get("StringValue", value.get("BinaryValue", ""))
        lines.append(f"  attribute:      {name}={shown!s} ({value.get('DataType', '')})")
    lines.append(f"  body:           {m.body}")
    lines.append(f"  receipt handle: {m.receipt_handle}")
    return "\n".join(lines)


def cmd_receive(args: argparse.Namespace, client: Client) -> int:
    messages = client.receive_message(
        args.queue,
        max_number_of_messages=args.n,
        visibility_timeout=args.visibility_timeout,
        wait_time_seconds=args.wait,
        attribute_names=["All"],
        message_attribute_names=["All"],
    )
    if args.json:
        _emit(args, {"Messages": [_sqs_keys(asdict(m)) for m in messages]}, None)
    elif not messages:
        print("no messages", file=sys.stderr)
    else:
        print("\n\n".join(_format_message(m) for m in messages))
    if args.delete:
        for m in messages:
            client.delete_message(args.queue, m.receipt_handle)
        if messages and not args.json:
            print(f"\ndeleted {len(messages)} message(s)", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_message(args.queue, args.receipt_handle)
    _emit(args, {"Deleted": True}, "deleted")
    return 0
