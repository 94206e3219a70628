"""Who may do what on the fabric: the NATS permissions of each role, made from the subject scheme.

Every role may publish and subscribe only what its job needs (nats-server's per-user permissions):

- replies go to the asker's own inboxes, ``_INBOX.embedfleet-<role>.>`` (each role connects with that
  inbox prefix), and a role subscribes to its own inboxes only: no role reads another's replies;
- a service answers a request only through ``allow_responses``: it may publish to the reply subject
  of a message it received, a bounded number of times, and to no other inbox. So a tokenizer or a
  worker cannot send results to a gateway for requests it was not given;
- JetStream is reached through its API subjects, each role the calls it makes on the project's own
  streams and bucket: stream information, never a stream's creation, update, deletion or purge;
  the consumers of the one stream it works from (tokenizers: the jobs stream, workers: the bulk
  stream), never another role's; readers (gateway, publisher) their own ephemeral consumers of the
  results stream and the bucket. Streams and the bucket are made and changed by ``embedfleet init``
  under the operator's user, which no service runs as;
- a job's claim (its owner's digest and the secret its batches are signed with, shared/jobs/claims.py)
  is published and read by its submitter's role only (``claims.gateway.*``, ``claims.publisher.*``),
  read by the tokenizers, and never replaced (the claims stream refuses a second message a subject).

NATS cannot express ownership that arises at run time: any job publisher may read the results
subject of any job (results live under ``<prefix>.v1.results.<job>``, and a permission cannot name
the jobs a user created), and a role that writes a job's record (its counts) may write all of it,
deletion included (NATS cannot split a key-value record by field). Per-tenant separation of jobs
needs a NATS account (or a user) per tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.jobs.bucket import PROGRESS_PREFIX
from embedfleet.shared.jobs.claims import claims_stream
from embedfleet.shared.jobs.streams import bucket_stream, stream_names
from embedfleet.shared.nats.subjects import SERVICE_NAMES, Subjects, inbox_prefix
from embedfleet.shared.protocol import MAX_BUNDLE

ROLES = ("gateway", "tokenizer", "worker", "scorer", "publisher", "operator")
# a worker answers one token batch in several result messages (one per max_payload of vectors)
MAX_RESPONSES = 10_000


# the NATS connection name of each role's processes (embedfleet.shared.nats.lifecycle.connect)
CONNECTION_NAMES = {
    "gateway": "embedfleet-gateway",
    "tokenizer": "embedfleet-tokenizer",
    "worker": "embedfleet-worker",
    "scorer": "embedfleet-scorer",
    "publisher": "embedfleet-reindex",
}


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responses: int = 0  # replies allowed per received request (allow_responses.max); 0: none

    def server_config(self) -> dict:
        """The ``permissions`` block of a nats-server user."""
        block: dict = {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}
        if self.responses:
            block["allow_responses"] = {"max": self.responses}
        return block


class _JetStream:
    """JetStream API subjects for the project's streams (``$JS.API.<call>.<stream>...``)."""

    def __init__(self, subjects: Subjects) -> None:
        self.names = stream_names(subjects)
        self.kv_stream = bucket_stream(subjects)
        self.bucket = self.names["kv"]
        self.claims = claims_stream(subjects)
        self.prefix = subjects.prefix

    def look(self) -> list[str]:
        """Read the streams' and the bucket's configuration and state (never change them)."""
        out = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
        streams = [self.names[k] for k in ("jobs", "bulk", "results", "dead")] + [self.kv_stream, self.claims]
        return out + [f"$JS.API.STREAM.INFO.{stream}" for stream in streams]

    def bucket_access(self, progress_only: bool = False) -> list[str]:
        """Read job states and write them (the key-value bucket's subjects and direct gets);
        ``progress_only``: write only their progress keys (shared/jobs/bucket.py), never a record."""
        kv = self.kv_stream
        return [
            f"$KV.{self.bucket}.{PROGRESS_PREFIX}>" if progress_only else f"$KV.{self.bucket}.>",
            f"$JS.API.DIRECT.GET.{kv}.>",
            f"$JS.API.DIRECT.GET.{kv}",
            f"$JS.API.STREAM.MSG.GET.{kv}",
        ]

    def claim(self, submitter: str) -> list[str]:
        """Claim jobs as ``submitter`` (once each) and read those claims back, by subject only."""
        subject = f"{self.prefix}.v1.claims.{submitter}.*"
        return [subject, f"$JS.API.DIRECT.GET.{self.claims}.{subject}"]

    def read_claims(self) -> list[str]:
        """Read every submitter's claims (the tokenizers check every job batch against its job's)."""
        return [f"$JS.API.DIRECT.GET.{self.claims}.{self.prefix}.v1.claims.*.*"]

    def _readers(self, stream: str) -> list[str]:
        return [
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
            f"$JS.API.CONSUMER.DELETE.{stream}.>",
            f"$JS.API.CONSUMER.INFO.{stream}.>",
        ]

    def bucket_listing(self) -> list[str]:
        """List the bucket's keys and records (an ephemeral consumer on its stream: ordered for the
        gateway's job gauges, pulled for GET /v1/jobs)."""
        return self._readers(self.kv_stream)

    def read_results(self) -> list[str]:
        """Read a job's stored results through an ephemeral consumer of the results stream (no acks)."""
        return self._readers(self.names["results"])

    def consume(self, kind: str) -> list[str]:
        """Bind, fetch from and acknowledge the durable pull consumers of the one stream the role works
        from (no other role has consumers there); give up its dead batches."""
        stream = self.names[kind]
        return [
            f"$JS.API.CONSUMER.CREATE.{stream}.*",
            f"$JS.API.CONSUMER.CREATE.{stream}.*.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
            f"$JS.API.CONSUMER.INFO.{stream}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.ACK.{stream}.>",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.STREAM.MSG.DELETE.{stream}",
        ]


def role_permissions(subjects: Subjects, role: str) -> Permissions:
    """What a process of ``role`` may publish and subscribe under ``subjects``' prefix."""
    # one branch a role, side by side: the whole table in one place reads better than split apart
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    p = f"{subjects.prefix}.v1"
    js = _JetStream(subjects)
    own_inbox = f"{inbox_prefix(CONNECTION_NAMES.get(role, 'embedfleet'))}.>"

    # every service answers $SRV.PING/INFO/STATS for its name (NATS micro services), replies by allow_responses
    def micro(name: str) -> list[str]:
        return (
            [f"$SRV.{verb}" for verb in ("PING", "INFO", "STATS")]
            + [f"$SRV.{verb}.{name}" for verb in ("PING", "INFO", "STATS")]
            + [f"$SRV.{verb}.{name}.*" for verb in ("PING", "INFO", "STATS")]
        )

    # who serves (FleetWatch), and whether one of them is gone (its own ping subject)
    watch = [f"$SRV.PING.{SERVICE_NAMES[r]}" for r in ("tokenizer", "worker", "scorer")] + [
        f"$SRV.PING.{SERVICE_NAMES[r]}.*" for r in ("tokenizer", "worker")
    ]
    dead = f"{p}.dead.*"

    def advisories(kind: str, durable: str) -> str:
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{js.names[kind]}.{durable}"

    if role == "gateway":
        return Permissions(
            publish=(
                f"{p}.embed.*",
                f"{p}.tokenize.*",
                f"{p}.decode.*",
                f"{p}.chunk.*",
                f"{p}.rerank.*",
                f"{p}.cancel.*",  # a request its client gave up: its rows dropped where they wait
                f"{p}.jobs.*",
                *watch,
                *js.look(),
                *js.bucket_access(),
                *js.claim("gateway"),
                *js.bucket_listing(),
                f"$JS.API.CONSUMER.LIST.{js.names['jobs']}",
                f"$JS.API.CONSUMER.LIST.{js.names['bulk']}",
                *js.read_results(),  # GET /v1/jobs/{id}/results
                # POST /v1/jobs "sink": the rows' sources kept beside the results, the results read and acked
                f"{p}.results.*.sources",
                f"$JS.ACK.{js.names['results']}.>",
            ),
            subscribe=(own_inbox, f"{p}.leaving", *micro(SERVICE_NAMES["gateway"])),
            responses=1,
        )
    if role == "tokenizer":
        return Permissions(
            publish=(
                f"{p}.tokens.*",
                f"{p}.worker.*.*",
                f"{p}.bulk.*",
                dead,
                *js.look(),
                *js.bucket_access(progress_only=True),  # counts, never a job's record
                *js.read_claims(),
                *js.consume("jobs"),
            ),
            subscribe=(
                own_inbox,
                f"{p}.embed.*",
                f"{p}.tokenize.*",
                f"{p}.decode.*",
                f"{p}.chunk.*",
                f"{p}.load.*",
                f"{p}.cancel.*",
                advisories("jobs", "*"),
                *micro(SERVICE_NAMES["tokenizer"]),
            ),
            # a Requests message brings up to MAX_BUNDLE requests, each refused (if at all) on its reply subject
            responses=MAX_BUNDLE,
        )
    if role == "worker":
        return Permissions(
            publish=(
                f"{p}.load.*",
                f"{p}.leaving",
                f"{p}.results.*",
                dead,
                *js.look(),
                *js.bucket_access(progress_only=True),  # counts, never a job's record
                *js.consume("bulk"),
                # a result stored as its job was cancelled is removed again (its rows are not counted)
                f"$JS.API.STREAM.MSG.DELETE.{js.names['results']}",
            ),
            subscribe=(
                own_inbox,
                f"{p}.tokens.*",
                f"{p}.worker.*.*",
                f"{p}.cancel.*",
                advisories("bulk", "*"),
                *micro(SERVICE_NAMES["worker"]),
            ),
            responses=MAX_RESPONSES,
        )
    if role == "scorer":
        return Permissions(
            publish=(f"{p}.embed.*", f"{p}.cancel.*", *watch),
            subscribe=(own_inbox, f"{p}.rerank.*", f"{p}.leaving", *micro(SERVICE_NAMES["scorer"])),
            responses=1,
        )
    if (
        role == "publisher"
    ):  # embedfleet reindex: checks the fleet serves the job, publishes it, collects its results; jobs fetch reads them
        results = js.names["results"]
        return Permissions(
            publish=(
                f"{p}.jobs.*",
                *watch,
                *js.look(),
                *js.bucket_access(),
                *js.claim("publisher"),
                *js.read_results(),
                f"$JS.ACK.{results}.>",
                f"$JS.API.STREAM.MSG.GET.{results}",
            ),
            subscribe=(own_inbox,),
        )
    # operator: embedfleet init (streams and bucket made and changed), jobs (list, purge, cancel), and
    # whatever administration needs; no service runs as it
    return Permissions(publish=(">",), subscribe=(">",), responses=0)


def write_auth(folder: Path, subjects: Subjects) -> Path:
    """A nats-server ``authorization`` block (``auth.conf``, to include in the server's config) with one
    nkey user per role and its permissions, and each role's seed in ``<role>.nk`` (mode 0600), which
    its processes are given as ``--nats-nkey-seed``. The server's file holds public keys only."""
    import json
    import os

    import nkeys

    folder.mkdir(parents=True, exist_ok=True)
    users = []
    for role in ROLES:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        public = nkeys.from_seed(bytearray(seed)).public_key.decode()
        path = folder / f"{role}.nk"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_bytes(seed + b"\n")
        users.append({"nkey": public, "permissions": role_permissions(subjects, role).server_config()})
    conf = folder / "auth.conf"
    lines = [
        f"# embedfleet roles under the subject prefix {subjects.prefix!r}: see shared/permissions.py",
        "authorization {",
        "  users = [",
    ]
    lines += [f"    {json.dumps(user)}  # {role}" for role, user in zip(ROLES, users)]
    lines += ["  ]", "}", ""]
    conf.write_text("\n".join(lines))
    return conf
