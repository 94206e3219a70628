"""Whether a bulk job can run on the fleet serving now, checked before any of it is published.

A job published for a model no worker serves, for an output the model cannot make, or in batches
whose vectors cannot fit in one NATS message, would only become dead letters, batch after batch.
What the fleet serves comes from the tokenizers' and workers' discovery metadata (shared/nats/fleet.py,
the same that GET /v1/models shows); the message limit from the server's INFO (``max_payload``).

A worker stores each token batch's vectors as one result message, and a token batch holds at most
a job batch's documents. So a job batch fits when its documents' vectors fit at their largest: a
dense row; a sparse vector with an entry for every vocabulary id the model can weigh (SPLADE: the
whole vocabulary; BGE-M3: one per token); a vector per token for the model's token limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from embedfleet.shared.jobs.batches import batch_room, document_bytes
from embedfleet.shared.jobs.image_docs import ImageDoc
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.nats.fleet import FleetView, FleetWatch
from embedfleet.shared.nats.subjects import model_token
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.protocol.messages import row_bytes
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import WIRE_FORMS

# bytes of a stored result besides its vectors and document ids: the message's other fields, the
# job id (in the message and its subject; at most MAX_JOB_ID bytes each), the headers (message id,
# trace context); as the worker's own check counts them, and more
RESULT_OVERHEAD = 1024 + 256 + 2 * 128
ID_OVERHEAD = 5  # msgpack's header of one document id
OFFSET_BYTES = 4  # a ragged result's offset per document (int32)
INDEX_BYTES = 4  # a sparse entry's vocabulary id (int32)
CHUNK_ROOM_TIMEOUT = 5.0  # seconds a tokenizer has to say whether a chunked job's windows fit the model


class JobRefused(ValueError):
    """A job the fleet cannot run as asked; ``field`` names what to change (an HTTP body's field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class JobTooLarge(JobRefused):
    """A job whose results would pass what one job may store (--job-max-result-bytes)."""


@dataclass(frozen=True, slots=True)
class Served:
    """A model as the fleet serves it: one live tokenizer's and one live worker's metadata."""

    model: str
    tokenizer: Mapping[str, str]
    worker: Mapping[str, str]

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o for o in (self.worker.get("outputs") or "dense").split(",") if o)

    @property
    def inputs(self) -> tuple[str, ...]:
        """What the model embeds: ("text",), or ("text", "image") for a two-tower model."""
        return tuple(i for i in (self.worker.get("inputs") or "text").split(",") if i)

    def number(self, key: str, *fallbacks: str) -> int:
        """A metadata number, from the worker's else the tokenizer's metadata, trying ``fallbacks`` in turn."""
        for name in (key, *fallbacks):
            for meta in (self.worker, self.tokenizer):
                try:
                    return int(meta[name])
                except (KeyError, ValueError):
                    continue
        return 0

    def document_bytes(self, options: EmbedOptions, image: bool = False) -> int:
        """The most bytes one document's vectors of ``options`` take in a stored result (``image``: a document
        that is an image, whose multi-vector a page model bounds by its page's tokens, not its text limit)."""
        dtype, output = options.dtype, options.output
        if output == "sparse":  # (id, value) entries, as many as vocabulary ids the model can weigh
            return (
                self.number("sparse_entries", "vocab_size") * (INDEX_BYTES + WIRE_FORMS[dtype].dtype.itemsize)
                + OFFSET_BYTES
            )
        if output == "multivector":  # a vector per token, up to the model's token limit (a page's: its tokens)
            tokens = (image and self.number("page_tokens")) or self.number("max_seq_length")
            return tokens * row_bytes(dtype, self.number("multivector_dim", "dim")) + OFFSET_BYTES
        return row_bytes(dtype, self.number("dim"))


@dataclass(frozen=True, slots=True)
class BatchFit:
    """The job batch size that fits, and why it is smaller than asked (None: as asked); for a job of
    images, the bytes of files a batch may carry besides (shared/jobs/batches.py; 0: no such limit)."""

    batch_size: int
    note: str | None = None
    batch_bytes: int = 0


def served_id(view: FleetView, model: str) -> str | None:
    """The served id whose tokenizers take ``model``'s job batches (the same subject token), if any."""
    return next((m for m in view.models if model_token(m) == model_token(model)), None)


def served(view: FleetView, model: str) -> Served:
    """``model`` as the fleet serves it; JobRefused when no tokenizer and worker serve it."""
    found = served_id(view, model)
    if found is None:
        alike = next((m for m in view.models if same_model(model, m)), None)
        hint = f": name it {alike!r}" if alike else f"; served: {', '.join(view.models) or 'none'}"
        raise JobRefused(f"model {model!r} is not served here (no live tokenizer and worker for it){hint}", "model")
    return Served(found, view.tokenizers[found], view.workers[found])


def check_output(model: Served, output: str) -> None:
    """JobRefused when ``model`` cannot make ``output`` vectors (a cross-encoder makes none)."""
    if model.worker.get("task") == "score":
        raise JobRefused(
            f"{model.model} is a cross-encoder: it scores (query, document) pairs and makes no vectors", "model"
        )
    if output not in model.outputs:
        raise JobRefused(f"{model.model} makes no {output} vectors (it makes: {', '.join(model.outputs)})", "output")


def fit_batch(
    model: Served, options: EmbedOptions, batch_size: int, max_payload: int, longest_id: int, images: bool = False
) -> BatchFit:
    """The job batch size (at most ``batch_size``) whose stored results fit in ``max_payload`` bytes,
    for document ids of at most ``longest_id`` bytes (``images``: documents that are images); JobRefused when
    not even one document fits."""
    per_document = model.document_bytes(options, images) + longest_id + ID_OVERHEAD
    fits = (max_payload - RESULT_OVERHEAD) // per_document
    kind = f"{options.output} vectors" if options.output != "dense" else "vector"
    if fits < 1:
        raise JobRefused(
            f"one document's {kind} from {model.model} may take {per_document:,} bytes, over the NATS "
            f"server's message limit of {max_payload:,} (max_payload): raise max_payload in the server's "
            "configuration, or ask a smaller embedding_type",
            "output",
        )
    if fits >= batch_size:
        return BatchFit(batch_size)
    return BatchFit(
        fits,
        f"batch size cut from {batch_size} to {fits}: a document's {kind} from {model.model} may "
        f"take {per_document:,} bytes, and a batch's results must fit in one NATS message of "
        f"{max_payload:,} bytes (max_payload)",
    )


def fit_chunks(model: Served, spec: ChunkSpec, batch_size: int, chars: Sequence[int]) -> BatchFit:
    """The job batch size (at most ``batch_size``) whose batches' documents, of ``chars`` characters
    each, make at most the tokenizers' ``max_chunks`` chunks a batch counted before anything is
    tokenized (``ChunkSpec.most_chunks``: a token a character), so that a tokenizer gives none of them
    up for its batch's sake; a document that alone makes more is a batch alone (the tokenizer counts
    its real chunks). As asked when the tokenizers say no limit (an older tokenizer)."""
    limit = model.number("max_chunks")
    if not limit or not chars:
        return BatchFit(batch_size)
    upto = np.concatenate(([0], np.cumsum([spec.most_chunks(n) for n in chars], dtype=np.int64)))

    def fits(size: int) -> bool:  # every batch of ``size`` documents within the limit
        starts = np.arange(0, len(chars), size)
        return bool((upto[np.minimum(starts + size, len(chars))] - upto[starts] <= limit).all())

    size = min(batch_size, len(chars))
    while size > 1 and not fits(size):
        size -= 1
    if size >= min(batch_size, len(chars)):
        return BatchFit(batch_size)
    return BatchFit(
        size,
        f"batch size cut from {batch_size} to {size}: a chunked batch is cut into at most {limit:,} chunks "
        f"(the tokenizers' --max-chunks), counted as its documents' characters / (chunking.size - overlap)",
    )


def check_job(
    view: FleetView,
    model: str,
    options: EmbedOptions,
    batch_size: int,
    max_payload: int,
    doc_ids: list[str],
    chunking: JobChunking | None = None,
    chars: Sequence[int] = (),
    max_result_bytes: int = 0,
    images: Sequence[ImageDoc] | None = None,
) -> BatchFit:
    """Everything the fleet must offer a job, checked before any of it is published. A chunked job
    (``chunking``, its documents of ``chars`` characters each): its batches within the tokenizers'
    chunks a batch too. A job of a vector a document: its results within ``max_result_bytes`` (0: no
    limit; a chunked job's are counted by the tokenizers as its chunks are cut), else JobTooLarge. A
    job of ``images`` (one a document): a model that embeds images, each image within one job batch's
    message (else JobTooLarge naming it), its batches cut by bytes too."""
    found = served(view, model)
    if images is not None:
        check_images(found, options, chunking)
    check_output(found, options.output)
    id_bytes = [len(d.encode()) for d in doc_ids]
    fit = fit_batch(found, options, batch_size, max_payload, max(id_bytes, default=0), images is not None)
    if images is not None:
        fit = BatchFit(fit.batch_size, fit.note, image_room(doc_ids, images, max_payload))
    if chunking is None:
        stored = len(doc_ids) * (found.document_bytes(options, images is not None) + ID_OVERHEAD) + sum(id_bytes)
        if max_result_bytes and stored > max_result_bytes:
            raise JobTooLarge(
                f"the job's {len(doc_ids):,} documents' vectors may take {stored:,} bytes in the results stream, "
                f"over the {max_result_bytes:,} one job may store (--job-max-result-bytes): submit them as "
                "several jobs",
                "documents",
            )
        return fit
    chunked = fit_chunks(found, chunking.spec, fit.batch_size, chars)
    return fit if chunked.batch_size == fit.batch_size else BatchFit(chunked.batch_size, chunked.note)


def check_images(model: Served, options: EmbedOptions, chunking: JobChunking | None) -> None:
    """JobRefused when a job of images cannot run as asked: a model that embeds texts only, and what
    ``check_image_options`` refuses."""
    if "image" not in model.inputs:
        raise JobRefused(
            f"{model.model} embeds {' and '.join(model.inputs)} only: it takes no image documents (a two-tower "
            "model, CLIP or SigLIP, embeds images)",
            "model",
        )
    check_image_options(options, chunking)


def check_image_options(options: EmbedOptions, chunking: JobChunking | None) -> None:
    """JobRefused for what a job of images cannot ask of any model: sparse vectors (a two-tower model makes
    an image a dense vector, a page model a vector per token: which one the model makes, ``check_output``
    says), chunks (cut from texts only)."""
    if options.output not in ("dense", "multivector"):
        raise JobRefused(
            f"images make dense vectors only, not {options.output} (a page model's: multivector)", "output"
        )
    if chunking is not None:
        raise JobRefused("chunking applies to texts: an image document is one vector", "chunking")


def image_room(doc_ids: Sequence[str], images: Sequence[ImageDoc], max_payload: int) -> int:
    """The bytes of images a job batch may carry under ``max_payload``; JobTooLarge naming the first
    document whose image cannot go in one."""
    room = batch_room(max_payload)
    for doc_id, image in zip(doc_ids, images, strict=True):
        if document_bytes(doc_id, image) > room:
            raise JobTooLarge(
                f"document {doc_id[:200]!r}: its image is {image.size:,} bytes, more than one job batch can carry "
                f"({room:,} bytes in a message of the NATS server's max_payload, {max_payload:,}): make it "
                "smaller, or raise max_payload in the server's configuration",
                "documents",
            )
    return room


async def fleet_view(nc, prefix: str, model: str, patience: float = 3.0) -> FleetView:
    """What the fleet serves, pinged again (half a second each) until ``model`` shows or ``patience``
    seconds passed: a busy process may answer a ping late."""
    watch = FleetWatch(nc, prefix, wait=0.5, interval=1.0)
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        view = await watch.refresh()
        if served_id(view, model) is not None or asyncio.get_running_loop().time() >= deadline:
            return view


async def check_chunk_room(
    chunker, model: str, chunking, options: EmbedOptions, timeout: float = CHUNK_ROOM_TIMEOUT
) -> None:
    """Refuses chunking whose windows ``model`` cannot hold (over its limit less its special tokens and
    the job's prompt), asking a tokenizer as the online route does: ``chunker`` is an EmbedClient,
    ``chunking`` a JobChunking. JobRefused naming the field to change."""
    from embedfleet.shared.errors import ErrorCode, ServiceError

    try:
        await chunker.chunk(model, [""], chunking.spec, options, timeout)
    except ServiceError as exc:
        field = "chunking.size" if exc.code == ErrorCode.INVALID_REQUEST and "chunking.size" in exc.message else "model"
        raise JobRefused(exc.message, field) from None
