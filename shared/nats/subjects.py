"""NATS subject and queue-group names, all under one configurable prefix."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# the bytes of a job id that stand for themselves in its subject token
_KEPT = frozenset((string.ascii_letters + string.digits + "-").encode())

# queue groups: each message on a data subject goes to one member of the fleet
TOKENIZER_QUEUE = "tokenizers"
WORKER_QUEUE = "workers"
SCORER_QUEUE = "scorers"

# names under which services register as NATS micro services ($SRV.PING/INFO/STATS)
SERVICE_NAMES = {
    "gateway": "embedfleet-gateway",
    "tokenizer": "embedfleet-tokenizer",
    "worker": "embedfleet-worker",
    "scorer": "embedfleet-scorer",
}


def model_token(model: str) -> str:
    """A model id as one subject token: 'BAAI/bge-small-en' -> 'BAAI_bge-small-en'."""
    token = _UNSAFE.sub("_", model)
    if not token:
        raise ValueError("model id must not be empty")
    return token


def job_token(job: str) -> str:
    """A job id as one subject token, one token per id: letters, digits and '-' as they are, every
    other byte (``_`` included) as ``_XX`` in hex, so 'docs.2026-12-01' -> 'docs_2E2026-12-01' and
    'docs_2026-12-01' -> 'docs_5F2026-12-01' are two subjects (``model_token`` would make both one).
    Ids of letters, digits and '-' (the ids reindex makes) keep the token they had."""
    if not job:
        raise ValueError("job id must not be empty")
    return "".join(chr(b) if b in _KEPT else f"_{b:02X}" for b in job.encode())


@dataclass(frozen=True, slots=True)
class Subjects:
    prefix: str = "embedfleet"

    def __post_init__(self) -> None:
        parts = self.prefix.split(".")
        if not all(p and not _UNSAFE.search(p) for p in parts):
            raise ValueError(f"invalid subject prefix {self.prefix!r}: use dot-separated [A-Za-z0-9_-] tokens")

    def embed(self, model: str) -> str:
        """gateway -> tokenizer fleet."""
        return f"{self.prefix}.v1.embed.{model_token(model)}"

    def tokens(self, model: str) -> str:
        """tokenizer -> worker fleet."""
        return f"{self.prefix}.v1.tokens.{model_token(model)}"

    def worker(self, model: str, worker_id: str) -> str:
        """tokenizer -> one worker, chosen by its load (load-aware routing)."""
        return f"{self.prefix}.v1.worker.{model_token(model)}.{model_token(worker_id)}"

    def cancel(self, model: str) -> str:
        """requester -> every tokenizer and worker of the model: a request given up (its Cancel)."""
        return f"{self.prefix}.v1.cancel.{model_token(model)}"

    def load(self, model: str) -> str:
        """workers -> tokenizers: queue depth reports."""
        return f"{self.prefix}.v1.load.{model_token(model)}"

    def leaving(self) -> str:
        """worker -> gateways and scorers: a worker's last load report, as it stops (its work drains)."""
        return f"{self.prefix}.v1.leaving"

    def tokenize(self, model: str) -> str:
        """gateway -> tokenizer fleet: show tokens (TEI /tokenize)."""
        return f"{self.prefix}.v1.tokenize.{model_token(model)}"

    def decode(self, model: str) -> str:
        """gateway -> tokenizer fleet: token IDs back to text (TEI /decode)."""
        return f"{self.prefix}.v1.decode.{model_token(model)}"

    def chunk(self, model: str) -> str:
        """gateway -> tokenizer fleet: where long texts are cut into chunks (their layout)."""
        return f"{self.prefix}.v1.chunk.{model_token(model)}"

    def jobs(self, model: str) -> str:
        """bulk job batches (JetStream, published by clients)."""
        return f"{self.prefix}.v1.jobs.{model_token(model)}"

    def bulk(self, model: str) -> str:
        """bulk token batches (JetStream work queue: tokenizers -> workers)."""
        return f"{self.prefix}.v1.bulk.{model_token(model)}"

    def results(self, job: str) -> str:
        """a job's vectors (JetStream, workers -> the job's collector)."""
        return f"{self.prefix}.v1.results.{job_token(job)}"

    def sources(self, job: str) -> str:
        """what a job's rows hold besides vectors (other input fields, texts), for the gateway's sink
        writer to find again after a restart (JetStream, in the results stream; shared/jobs/sources.py)."""
        return f"{self.prefix}.v1.results.{job_token(job)}.sources"

    def dead(self, job: str) -> str:
        """dead letters of a job: batches given up, with the stage and the reason (JetStream)."""
        return f"{self.prefix}.v1.dead.{job_token(job)}"

    def rerank(self, model: str) -> str:
        """gateway -> scorer fleet."""
        return f"{self.prefix}.v1.rerank.{model_token(model)}"


def inbox_prefix(connection_name: str) -> str:
    """The inbox prefix of a connection: every process's replies come to inboxes under its own name."""
    return f"_INBOX.{connection_name}"
