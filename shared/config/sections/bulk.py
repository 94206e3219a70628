"""Options of bulk work: how a batch is held (ack wait, deliveries), how long a job's output and record are kept."""

from __future__ import annotations

from embedfleet.shared.config.commands import BULK, STREAMS
from embedfleet.shared.config.option import (
    Option,
    declare,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

DAY = 24 * 3600.0
RESULTS_MAX_AGE = 7 * DAY  # the results stream's age limit when it is created with none given
JOB_TTL = 30 * DAY  # the job bucket's, as long as dead letters are kept
MAX_JOB_HISTORY = 64  # JetStream's limit on a key-value bucket's revisions per key
MAX_REPLICAS = 5  # JetStream's limit on a stream's replicas

OPTIONS: tuple[Option, ...] = (
    declare(
        "--ack-wait",
        "EMBEDFLEET_ACK_WAIT",
        60.0,
        "seconds before an unacknowledged bulk batch is delivered again",
        BULK,
        "jobs",
        type=positive_float,
    ),
    declare(
        "--max-deliver",
        "EMBEDFLEET_MAX_DELIVER",
        5,
        "deliveries of a bulk batch before it is given up as a dead letter",
        BULK,
        "jobs",
        type=positive_int,
    ),
    declare(
        "--results-max-age",
        "EMBEDFLEET_RESULTS_MAX_AGE",
        None,
        "seconds a job's results are kept in the results stream, 0: no age limit; unset: as the stream has it "
        f"({RESULTS_MAX_AGE:.0f} when created)",
        STREAMS,
        "retention",
        type=non_negative_float,
    ),
    declare(
        "--results-max-bytes",
        "EMBEDFLEET_RESULTS_MAX_BYTES",
        None,
        "bytes the results stream may hold, the oldest results dropped first; 0: no size limit; unset: as the "
        "stream has it (0 when created: a limit reserves that much of the server's JetStream storage)",
        STREAMS,
        "retention",
        type=non_negative_int,
    ),
    declare(
        "--job-ttl",
        "EMBEDFLEET_JOB_TTL",
        None,
        "seconds a job's record is kept after its last change, 0: kept; unset: as the bucket has it "
        f"({JOB_TTL:.0f} when created)",
        STREAMS,
        "retention",
        type=non_negative_float,
    ),
    declare(
        "--job-history",
        "EMBEDFLEET_JOB_HISTORY",
        None,
        f"revisions kept of each job's record, 1..{MAX_JOB_HISTORY}; unset: as the bucket has it (1 when created)",
        STREAMS,
        "retention",
        type=positive_int,
    ),
    declare(
        "--stream-replicas",
        "EMBEDFLEET_STREAM_REPLICAS",
        None,
        f"copies a clustered NATS keeps of each job stream and of the job bucket, 1..{MAX_REPLICAS}; unset: 3 "
        "where the cluster can place them, else 1 (an existing stream is raised to that, never lowered)",
        STREAMS,
        "retention",
        type=positive_int,
    ),
)
