"""sqsq: an SQS-class message queue server."""
