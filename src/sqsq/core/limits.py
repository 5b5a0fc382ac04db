"""Every bound sqsq enforces, in one place (SQS's published quotas where SQS has one)."""

from __future__ import annotations

# Queue attributes: (minimum, maximum, default), in the attribute's own unit.
VISIBILITY_TIMEOUT_S = (0, 43_200, 30)
DELAY_SECONDS = (0, 900, 0)
MESSAGE_RETENTION_PERIOD_S = (60, 1_209_600, 345_600)
MAXIMUM_MESSAGE_SIZE_BYTES = (1_024, 1_048_576, 1_048_576)
RECEIVE_MESSAGE_WAIT_TIME_S = (0, 20, 0)
MAX_RECEIVE_COUNT = (1, 1_000)

QUEUE_NAME_MAX_LEN = 80
BATCH_MAX_ENTRIES = 10
BATCH_ENTRY_ID_MAX_LEN = 80
RECEIVE_MAX_MESSAGES = 10
# sqsq's bound: a receive's messages together (SQS's size, body and attributes) stop short of
# this, so its reply fits the 4 MiB a gRPC message carries (ten of 1 MiB do not); the first
# message always goes. A receive answered "too large" after it made its messages invisible
# left a FIFO group stuck behind them for good (the chaos suite's big-messages-partition).
RECEIVE_REPLY_MAX_BYTES = 3 * 1024 * 1024
RECEIVE_WAIT_MAX_S = 20
MESSAGE_ATTRIBUTES_MAX = 10
MESSAGE_ATTRIBUTE_NAME_MAX_LEN = 256
MESSAGE_ATTRIBUTE_TYPE_MAX_LEN = 256
FIFO_ID_MAX_LEN = 128  # MessageGroupId and MessageDeduplicationId
QUEUE_TAGS_MAX = 50
AWS_TRACE_HEADER_MAX_LEN = 8_192  # sqsq's bound; an X-Ray trace header is ~100 characters
IN_FLIGHT_MAX = 120_000  # messages received and not yet deleted or returned, per queue

DEDUPLICATION_WINDOW_MS = 5 * 60 * 1000
QUEUE_DELETED_RECENTLY_MS = 60 * 1000
PURGE_IN_PROGRESS_MS = 60 * 1000
LIST_QUEUES_MAX_RESULTS = 1000

# Work bounds per command, so one apply never does unbounded work.
SWEEP_MAX_ITEMS = 2_000
RECEIVE_SCAN_MAX = 1_000
