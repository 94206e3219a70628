"""A job's claim: who made it, written once, and the secret its batches are signed with.

The job bucket's record is written by every stage (counts, dead batches, leases), and NATS cannot
split a key-value record by field. What must never change after a job is made lives apart, in the
stream ``<P>_CLAIMS`` (made by ``embedfleet init``), one message a job and submitter:

- subject ``<prefix>.v1.claims.<submitter>.<job token>``, the submitter ``gateway`` (POST /v1/jobs) or
  ``publisher`` (``embedfleet reindex``): each role's NATS user may publish and read its own
  submitter's claims only, the tokenizers read all (shared/permissions.py);
- the stream keeps one message a subject and refuses the next (discard new per subject): the server
  itself refuses a second claim, so an owner digest, once written, stays;
- the body: the owner's key digest (None: a job made without a key) and a random 256-bit secret.

Every job batch carries ``HMAC-SHA256(secret, body)`` and its submitter in headers (``sign``); the
tokenizer takes a batch only when the job's first claim (the lowest stream sequence of either
submitter's) verifies it (``ClaimBook.check``). A batch naming no claimed job, or with a wrong MAC,
is refused before anything of it is counted. A gateway reading a job checks the record's owner
against its claim (``ClaimedBucket``): a rewritten owner is not served.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

import orjson
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from embedfleet.shared.jobs.bucket import PROGRESS_PREFIX
from embedfleet.shared.jobs.state import JobState, JobStateError
from embedfleet.shared.nats.subjects import Subjects, job_token

SUBMITTERS = ("gateway", "publisher")
MAC = "Embedfleet-Job-Mac"  # hex HMAC-SHA256 of a job batch's body under its job's secret
SUBMITTER = "Embedfleet-Submitter"  # which submitter's claim signs the batch


def claims_stream(subjects: Subjects) -> str:
    return f"{subjects.prefix.replace('.', '_').replace('-', '_').upper()}_CLAIMS"


def claim_subject(subjects: Subjects, submitter: str, job: str) -> str:
    if submitter not in SUBMITTERS:
        raise ValueError(f"unknown job submitter {submitter!r}: one of {', '.join(SUBMITTERS)}")
    return f"{subjects.prefix}.v1.claims.{submitter}.{job_token(job)}"


def claims_config(subjects: Subjects, ttl: float) -> StreamConfig:
    """One message a subject, never replaced (a second is refused); kept as long as job records."""
    return StreamConfig(
        name=claims_stream(subjects),
        subjects=[f"{subjects.prefix}.v1.claims.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
        allow_direct=True,  # read by subject ($JS.API.DIRECT.GET.<stream>.<subject>): permissions name it
        max_age=ttl,
    )


class ClaimRefused(Exception):
    """The server refused a claim: one exists already for this submitter and job."""


@dataclass(frozen=True, slots=True)
class JobClaim:
    job: str
    submitter: str
    owner: str | None
    secret: bytes  # 32 random bytes
    seq: int  # its sequence in the claims stream: the lower of two claims of one job is the job's

    def sign(self, body: bytes) -> dict[str, str]:
        """The headers that prove a job batch's ``body`` comes from this job's submitter."""
        return {MAC: hmac.new(self.secret, body, hashlib.sha256).hexdigest(), SUBMITTER: self.submitter}

    def verifies(self, body: bytes, mac: str) -> bool:
        want = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        return isinstance(mac, str) and mac.isascii() and hmac.compare_digest(want, mac)  # a header is untrusted


async def read_claim(js: JetStreamContext, subjects: Subjects, submitter: str, job: str) -> JobClaim | None:
    """The claim ``submitter`` made for ``job``, or None."""
    try:
        msg = await js.get_last_msg(claims_stream(subjects), claim_subject(subjects, submitter, job), direct=True)
    except NotFoundError:
        return None
    try:
        body = orjson.loads(msg.data or b"")
        owner, secret = body["owner"], bytes.fromhex(body["secret"])
        if body["job"] != job or not (owner is None or isinstance(owner, str)) or len(secret) != 32:
            raise ValueError("fields")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise JobStateError(f"job {job}: its claim by the {submitter} is not one this code writes") from None
    return JobClaim(job, submitter, owner, secret, msg.seq or 0)


async def make_claim(js: JetStreamContext, subjects: Subjects, submitter: str, job: str, owner: str | None) -> JobClaim:
    """Claim ``job`` for ``submitter`` and ``owner`` with a new secret; the claim already there when
    one is (its owner may differ: the caller compares). ClaimRefused when the server refuses both."""
    existing = await read_claim(js, subjects, submitter, job)
    if existing is not None:
        return existing
    secret = secrets.token_bytes(32)
    body = orjson.dumps({"job": job, "owner": owner, "secret": secret.hex()})
    try:
        ack = await js.publish(claim_subject(subjects, submitter, job), body)  # refused if one was made meanwhile
    except APIError as exc:  # claimed meanwhile (by another gateway): that claim is the job's
        existing = await read_claim(js, subjects, submitter, job)
        if existing is None:
            raise ClaimRefused(f"job {job}: claim refused ({exc.description})") from None
        return existing
    return JobClaim(job, submitter, owner, secret, ack.seq)


async def first_claim(js: JetStreamContext, subjects: Subjects, job: str) -> JobClaim | None:
    """The job's claim: of both submitters' (each reads only its own), the one made first."""
    found = [c for s in SUBMITTERS if (c := await read_claim(js, subjects, s, job)) is not None]
    return min(found, key=lambda c: c.seq) if found else None


class ClaimBook:
    """The tokenizer's check of job batches, with the claims it read remembered for ``ttl`` seconds
    (a claim never changes; a purged job's id may name a new one after that)."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, ttl: float = 60.0, size: int = 4096) -> None:
        self._js, self._subjects, self._ttl, self._size = js, subjects, ttl, size
        self._seen: OrderedDict[str, tuple[float, JobClaim | None]] = OrderedDict()

    async def check(self, job: str, body: bytes, headers: dict) -> str | None:
        """Why a batch of ``job`` with ``body`` and ``headers`` is refused (None: it is the job's)."""
        mac, submitter = headers.get(MAC, ""), headers.get(SUBMITTER, "")
        read, claim = self._seen.get(job, (None, None))
        if read is None or time.monotonic() - read >= self._ttl or not _signs(claim, body, mac, submitter):
            claim = await self._read(job)  # a claim remembered may be a purged job's: read again before refusing
        if claim is None:
            return f"job {job[:100]!r} was never submitted (no claim): a batch naming it is not one of a job"
        if not _signs(claim, body, mac, submitter):
            return f"job {job}: the batch's signature is not its submitter's (forged or altered)"
        return None

    async def _read(self, job: str) -> JobClaim | None:
        claim = await first_claim(self._js, self._subjects, job)
        self._seen[job] = (time.monotonic(), claim)
        self._seen.move_to_end(job)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return claim


def _signs(claim: JobClaim | None, body: bytes, mac: str, submitter: str) -> bool:
    return claim is not None and submitter == claim.submitter and claim.verifies(body, mac)


async def owner_holds(js: JetStreamContext, subjects: Subjects, state: JobState) -> bool:
    """Whether ``state``'s owner is the one the gateway's claim of the job names (no claim: no owner)."""
    if state.owner is None and not state.submitted:
        return True
    claim = await read_claim(js, subjects, "gateway", state.job)
    return state.owner == (claim.owner if claim is not None else None)


class ClaimedBucket(KeyValue):
    """The job bucket as a gateway reads it: a record's owner checked against the gateway's claim of
    the job (none: the job was not made through a gateway, and has no owner). A record whose owner
    differs was rewritten by another role: JobStateError, so it is neither served nor updated."""

    def __init__(self, kv: KeyValue, js: JetStreamContext, subjects: Subjects) -> None:
        super().__init__(name=kv._name, stream=kv._stream, pre=kv._pre, js=kv._js, direct=kv._direct)
        self._claims_js, self._subjects = js, subjects

    async def get(self, key: str, revision: int | None = None, validate_keys: bool = True) -> KeyValue.Entry:
        entry = await super().get(key, revision, validate_keys)
        if key.startswith(PROGRESS_PREFIX):  # a job's progress key: counts, no owner (shared/jobs/bucket.py)
            return entry
        if not await owner_holds(self._claims_js, self._subjects, JobState.decode(entry.value, key)):
            raise JobStateError(f"job {key}: its record's owner is not the one that made it (rewritten)")
        return entry
