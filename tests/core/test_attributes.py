import json

import pytest

from sqsq.core.attributes import (
    SETTABLE_ATTRIBUTE_NAMES,
    QueueAttributes,
    parse_queue_attributes,
    render_queue_attributes,
)
from sqsq.core.names import parse_queue_arn, validate_queue_name
from sqsq.core.redrivepolicy import RedrivePolicy
from sqsq.errors import ErrorCode, Rejection

DLQ_ARN = "arn:aws:sqs:us-east-1:123456789012:dlq"


def create(raw: dict[str, str], name: str = "q") -> QueueAttributes | Rejection:
    return parse_queue_attributes(raw, queue_name=name)


def ok(result: QueueAttributes | Rejection) -> QueueAttributes:
    assert isinstance(result, QueueAttributes), result
    return result


def code(result: object) -> ErrorCode:
    assert isinstance(result, Rejection), result
    return result.code


# --- queue names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["q", "a" * 80, "Az09_-", "a" * 75 + ".fifo", "x.fifo", "my-queue_1"],
)
def test_valid_queue_names(name: str) -> None:
    assert validate_queue_name(name) is None


@pytest.mark.parametrize(
    "name",
    ["", "a" * 81, "a" * 76 + ".fifo", ".fifo", "a.b", "a b", "a/b", "é", "q.FIFO", "a.fifo.fifo"],
)
def test_invalid_queue_names(name: str) -> None:
    assert code(validate_queue_name(name)) is ErrorCode.INVALID_PARAMETER_VALUE


# --- defaults and integer attributes -----------------------------------------------------


def test_defaults() -> None:
    attrs = ok(create({}))
    assert attrs == QueueAttributes()
    assert (attrs.visibility_timeout_s, attrs.delay_seconds) == (30, 0)
    assert attrs.message_retention_period_s == 345600
    assert attrs.maximum_message_size == 1048576
    assert attrs.receive_message_wait_time_s == 0
    assert attrs.redrive_policy is None and not attrs.fifo_queue


@pytest.mark.parametrize(
    ("name", "field", "lo", "hi"),
    [
        ("VisibilityTimeout", "visibility_timeout_s", 0, 43200),
        ("DelaySeconds", "delay_seconds", 0, 900),
        ("MessageRetentionPeriod", "message_retention_period_s", 60, 1209600),
        ("MaximumMessageSize", "maximum_message_size", 1024, 1048576),
        ("ReceiveMessageWaitTimeSeconds", "receive_message_wait_time_s", 0, 20),
    ],
)
def test_integer_bounds(name: str, field: str, lo: int, hi: int) -> None:
    assert getattr(ok(create({name: str(lo)})), field) == lo
    assert getattr(ok(create({name: str(hi)})), field) == hi
    for bad in (str(lo - 1), str(hi + 1), "", "abc", "1.5", " 5", "٣"):
        rej = create({name: bad})
        assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_VALUE, bad
        assert isinstance(rej, Rejection)
        assert rej.message == f"Invalid value for the parameter {name}."


def test_unknown_and_read_only_names_rejected() -> None:
    for name in ("Bogus", "QueueArn", "ApproximateNumberOfMessages", "visibilitytimeout"):
        rej = create({name: "1"})
        assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_NAME
        assert isinstance(rej, Rejection) and rej.message == f"Unknown Attribute {name}."


def test_set_starts_from_base_and_keeps_other_values() -> None:
    base = ok(create({"VisibilityTimeout": "10", "DelaySeconds": "5"}))
    updated = ok(parse_queue_attributes({"DelaySeconds": "7"}, queue_name="q", base=base))
    assert (updated.visibility_timeout_s, updated.delay_seconds) == (10, 7)
    # The base is untouched (frozen values).
    assert base.delay_seconds == 5


def test_set_rejection_leaves_nothing_half_applied() -> None:
    base = ok(create({}))
    rej = parse_queue_attributes(
        {"DelaySeconds": "7", "VisibilityTimeout": "-1"}, queue_name="q", base=base
    )
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_VALUE


# --- FIFO --------------------------------------------------------------------------------


def test_fifo_create() -> None:
    attrs = ok(create({"FifoQueue": "true"}, "q.fifo"))
    assert attrs.fifo_queue and not attrs.content_based_deduplication
    assert (attrs.deduplication_scope, attrs.fifo_throughput_limit) == ("queue", "perQueue")
    attrs = ok(
        create(
            {
                "FifoQueue": "TRUE",
                "ContentBasedDeduplication": "true",
                "DeduplicationScope": "messageGroup",
                "FifoThroughputLimit": "perMessageGroupId",
            },
            "q.fifo",
        )
    )
    assert attrs.content_based_deduplication
    assert attrs.deduplication_scope == "messageGroup"
    assert attrs.fifo_throughput_limit == "perMessageGroupId"


def test_per_message_group_throughput_needs_message_group_deduplication() -> None:
    rej = create({"FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"}, "q.fifo")
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    assert "DeduplicationScope is messageGroup" in rej.message
    high = ok(create({"FifoQueue": "true", "DeduplicationScope": "messageGroup",
                      "FifoThroughputLimit": "perMessageGroupId"}, "q.fifo"))
    back = parse_queue_attributes({"DeduplicationScope": "queue"}, queue_name="q.fifo",
                                  base=high)
    assert code(back) is ErrorCode.INVALID_ATTRIBUTE_VALUE


def test_fifo_name_and_flag_must_agree() -> None:
    assert code(create({}, "q.fifo")) is ErrorCode.INVALID_PARAMETER_VALUE
    assert code(create({"FifoQueue": "false"}, "q.fifo")) is ErrorCode.INVALID_PARAMETER_VALUE
    assert code(create({"FifoQueue": "true"}, "q")) is ErrorCode.INVALID_PARAMETER_VALUE
    assert code(create({"FifoQueue": "yes"}, "q")) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    assert code(create({"FifoQueue": "yes"}, "q.fifo")) is ErrorCode.INVALID_ATTRIBUTE_VALUE


def test_fifo_only_attributes_on_standard_queue() -> None:
    for name, value in (
        ("ContentBasedDeduplication", "false"),
        ("DeduplicationScope", "queue"),
        ("FifoThroughputLimit", "perQueue"),
    ):
        assert code(create({name: value})) is ErrorCode.INVALID_ATTRIBUTE_NAME, name
        base = ok(create({}))
        rej = parse_queue_attributes({name: value}, queue_name="q", base=base)
        assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_NAME, name


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("ContentBasedDeduplication", "1"),
        ("DeduplicationScope", "group"),
        ("DeduplicationScope", "Queue"),
        ("FifoThroughputLimit", "perGroup"),
    ],
)
def test_fifo_attribute_values(name: str, bad: str) -> None:
    rej = create({"FifoQueue": "true", name: bad}, "q.fifo")
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_VALUE


def test_fifo_queue_is_unknown_on_standard_queues() -> None:
    """As Amazon answers: the attribute does not exist on a standard queue, "false" included."""
    for value in ("false", "true"):
        rej = parse_queue_attributes({"FifoQueue": value}, queue_name="q", base=ok(create({})))
        assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_NAME
        assert rej.message == "Unknown Attribute FifoQueue."
    rej = create({"FifoQueue": "false"}, "q")
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_NAME
    assert rej.message == "Unknown Attribute FifoQueue."


def test_queue_type_cannot_change_on_set() -> None:
    fifo = ok(create({"FifoQueue": "true"}, "q.fifo"))
    std = ok(create({}))
    rej = parse_queue_attributes({"FifoQueue": "false"}, queue_name="q.fifo", base=fifo)
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    rej = parse_queue_attributes({"FifoQueue": "true"}, queue_name="q", base=std)
    assert code(rej) is ErrorCode.INVALID_ATTRIBUTE_NAME  # unknown on a standard queue
    # Restating the current type is harmless.
    assert ok(parse_queue_attributes({"FifoQueue": "true"}, queue_name="q.fifo", base=fifo)) == fifo
    updated = parse_queue_attributes(
        {"ContentBasedDeduplication": "true"}, queue_name="q.fifo", base=fifo
    )
    assert ok(updated).content_based_deduplication


# --- redrive -----------------------------------------------------------------------------


def redrive(doc: object) -> dict[str, str]:
    return {"RedrivePolicy": doc if isinstance(doc, str) else json.dumps(doc)}


def test_redrive_policy_parsed_and_rendered() -> None:
    attrs = ok(create(redrive({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 5})))
    assert attrs.redrive_policy == RedrivePolicy(DLQ_ARN, 5)
    assert attrs.redrive_policy.to_json() == (
        '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:dlq","maxReceiveCount":5}'
    )
    # A numeric string count is accepted and normalized to a number.
    attrs = ok(create(redrive({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": "1000"})))
    assert attrs.redrive_policy == RedrivePolicy(DLQ_ARN, 1000)
    assert ok(create(redrive({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 1})))


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        "[]",
        {"deadLetterTargetArn": DLQ_ARN},
        {"maxReceiveCount": 3},
        {"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 0},
        {"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 1001},
        {"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": "x"},
        {"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": True},
        {"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 2.5},
        {"deadLetterTargetArn": "dlq", "maxReceiveCount": 3},
        {"deadLetterTargetArn": "arn:aws:sns:us-east-1:123456789012:t", "maxReceiveCount": 3},
    ],
)
def test_bad_redrive_policy(doc: object) -> None:
    assert code(create(redrive(doc))) is ErrorCode.INVALID_PARAMETER_VALUE


def test_redrive_policy_removed_by_empty_string() -> None:
    base = ok(create(redrive({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 5})))
    cleared = ok(parse_queue_attributes({"RedrivePolicy": ""}, queue_name="q", base=base))
    assert cleared.redrive_policy is None
    assert "RedrivePolicy" not in render_queue_attributes(cleared)


def test_redrive_allow_policy() -> None:
    attrs = ok(create({"RedriveAllowPolicy": '{ "redrivePermission" : "denyAll" }'}))
    assert attrs.redrive_allow_policy == '{"redrivePermission":"denyAll"}'
    doc = {"redrivePermission": "byQueue", "sourceQueueArns": [DLQ_ARN] * 10}
    attrs = ok(create({"RedriveAllowPolicy": json.dumps(doc)}))
    assert json.loads(attrs.redrive_allow_policy or "") == doc
    assert ok(create({"RedriveAllowPolicy": '{"redrivePermission":"allowAll"}'}))


@pytest.mark.parametrize(
    "doc",
    [
        "{",
        {"redrivePermission": "some"},
        {},
        {"redrivePermission": "byQueue"},
        {"redrivePermission": "byQueue", "sourceQueueArns": []},
        {"redrivePermission": "byQueue", "sourceQueueArns": [DLQ_ARN] * 11},
        {"redrivePermission": "byQueue", "sourceQueueArns": ["nope"]},
        {"redrivePermission": "allowAll", "sourceQueueArns": [DLQ_ARN]},
        {"redrivePermission": "denyAll", "extra": 1},
    ],
)
def test_bad_redrive_allow_policy(doc: object) -> None:
    raw = doc if isinstance(doc, str) else json.dumps(doc)
    assert code(create({"RedriveAllowPolicy": raw})) is ErrorCode.INVALID_PARAMETER_VALUE



@pytest.mark.parametrize("attribute,what", [("RedrivePolicy", "Redrive policy"),
                                            ("RedriveAllowPolicy", "Redrive allow policy")])
@pytest.mark.parametrize("raw", ["{", "[1]", '"text"'])
def test_a_policy_that_is_no_json_object_is_refused_as_sqs_words_it(
        attribute: str, what: str, raw: str) -> None:
    refused = create({attribute: raw})
    assert isinstance(refused, Rejection)
    assert refused.message == (f"Value {raw} for parameter {attribute} is invalid. Reason: "
                               f"{what} is not a dict or valid json.")

# --- extras ------------------------------------------------------------------------------


def test_extra_attributes_echoed() -> None:
    policy = '{"Version":"2012-10-17","Statement":[]}'
    attrs = ok(
        create(
            {
                "Policy": policy,
                "KmsMasterKeyId": "alias/aws/sqs",
                "KmsDataKeyReusePeriodSeconds": "300",
            }
        )
    )
    rendered = render_queue_attributes(attrs)
    assert rendered["Policy"] == policy
    assert rendered["KmsMasterKeyId"] == "alias/aws/sqs"
    assert rendered["KmsDataKeyReusePeriodSeconds"] == "300"
    assert rendered["SqsManagedSseEnabled"] == "false"
    cleared = ok(parse_queue_attributes({"Policy": ""}, queue_name="q", base=attrs))
    assert "Policy" not in render_queue_attributes(cleared)
    assert dict(cleared.extra)["KmsMasterKeyId"] == "alias/aws/sqs"


def test_bad_extra_values() -> None:
    assert code(create({"Policy": "nope"})) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    assert code(create({"KmsDataKeyReusePeriodSeconds": "59"})) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    assert code(create({"KmsDataKeyReusePeriodSeconds": "86401"})) is (
        ErrorCode.INVALID_ATTRIBUTE_VALUE
    )
    assert code(create({"SqsManagedSseEnabled": "on"})) is ErrorCode.INVALID_ATTRIBUTE_VALUE
    assert dict(ok(create({"SqsManagedSseEnabled": "False"})).extra) == {
        "SqsManagedSseEnabled": "false"
    }


# --- rendering ---------------------------------------------------------------------------


def test_render_standard_defaults() -> None:
    assert render_queue_attributes(QueueAttributes()) == {
        "VisibilityTimeout": "30",
        "DelaySeconds": "0",
        "MessageRetentionPeriod": "345600",
        "MaximumMessageSize": "1048576",
        "ReceiveMessageWaitTimeSeconds": "0",
        "SqsManagedSseEnabled": "true",
    }


def test_render_fifo() -> None:
    rendered = render_queue_attributes(ok(create({"FifoQueue": "true"}, "q.fifo")))
    assert rendered["FifoQueue"] == "true"
    assert rendered["ContentBasedDeduplication"] == "false"
    assert rendered["DeduplicationScope"] == "queue"
    assert rendered["FifoThroughputLimit"] == "perQueue"


def test_rendered_attributes_parse_back() -> None:
    attrs = ok(
        create(
            {
                "FifoQueue": "true",
                "VisibilityTimeout": "45",
                "ContentBasedDeduplication": "true",
                **redrive({"deadLetterTargetArn": DLQ_ARN + ".fifo", "maxReceiveCount": 4}),
            },
            "q.fifo",
        )
    )
    rendered = render_queue_attributes(attrs)
    assert set(rendered) <= SETTABLE_ATTRIBUTE_NAMES
    again = ok(create(rendered, "q.fifo"))
    assert again.redrive_policy == attrs.redrive_policy
    assert render_queue_attributes(again) == rendered


# --- ARNs --------------------------------------------------------------------------------


def test_parse_queue_arn() -> None:
    assert parse_queue_arn(DLQ_ARN) == ("us-east-1", "123456789012", "dlq")
    assert parse_queue_arn("arn:aws:sqs:eu-west-1:000000000000:q.fifo") == (
        "eu-west-1",
        "000000000000",
        "q.fifo",
    )
    for bad in (
        "",
        "dlq",
        "arn:aws:sns:us-east-1:123456789012:q",
        "arn:aws:sqs:us-east-1:123:q",
        "arn:aws:sqs:us-east-1:123456789012:",
        "arn:aws:sqs:us-east-1:123456789012:a.b",
        "arn:aws:sqs:us-east-1:123456789012:" + "a" * 81,
    ):
        assert parse_queue_arn(bad) is None, bad
