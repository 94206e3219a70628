"""First-come-first-served batching of sequences under a token budget. No NATS, no torch here.

Token batches from the tokenizers queue up whole; the scheduler cuts batches for the engine out
of them sequence by sequence, oldest first, closing a batch at ``max_tokens`` tokens or
``max_seqs`` sequences. A queued batch whose deadline passed is dropped: none of its rows is
scheduled after that, so a batch costs at most what runs before its deadline (plus the engine batch
then running). An online batch whose requester cancelled it (a Cancel with its key) is dropped too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from nats.aio.msg import Msg

from embedfleet.shared.observability.tracing import TraceContext
from embedfleet.shared.protocol import Spans, TokenChunk


@dataclass(slots=True)
class Work:
    """One TokenChunk in the worker: its rows fill ``vectors`` as engine batches complete."""

    batch: TokenChunk
    reply: str
    arrived: float = 0.0  # perf_counter when queued
    started: float | None = None  # perf_counter when its first rows were launched
    inference: float = 0.0  # seconds of engine batches its rows were in
    source: Msg | None = None  # bulk work: the JetStream message to acknowledge once answered
    next_row: int = 0  # first row not yet scheduled
    done_rows: int = 0
    # [count, dim] float32 (tokens, multivector: [tokens, dim]; spans: [spans, dim]), allocated on first result
    vectors: np.ndarray | None = None
    trace: TraceContext | None = None  # the trace context its message brought (spans.py)
    carrier: str = ""  # the reply subject this process may answer on, when not ``reply`` (shared/nats/bundles.py)

    @property
    def rows_left(self) -> int:
        """Rows not yet scheduled."""
        return self.batch.count - self.next_row

    @property
    def pending_tokens(self) -> int:
        cu = self.batch.cu_seqlens
        return int(cu[-1] - cu[self.next_row])


@dataclass(slots=True)
class Slice:
    work: Work
    row_start: int
    row_end: int


@dataclass(slots=True)
class Batch:
    input_ids: np.ndarray  # [T] int32
    cu_seqlens: np.ndarray  # [B + 1] int32
    slices: list[Slice] = field(default_factory=list)
    token_types: np.ndarray | None = None  # [T] int32, when any work carries segment ids
    skip: np.ndarray | None = None  # [B] int32 leading tokens of each row that pooling skips, when any work has some
    outputs: tuple[str, ...] = ("dense",)  # the output kinds its works ask for
    spans: Spans | None = None  # [B] rows' spans, when any work asks for them (others' rows have none)
    adapters: np.ndarray | None = None  # [B] int32 each row's task adapter (0: none), when any work names a task
    # image rows [B, C, H, W] uint8 (a batch is all images or all token rows); input_ids is then empty
    pixels: np.ndarray | None = None
    # a page model's images in the batch's rows that have one (ColQwen2): patch rows [P, width] uint8 and
    # grids [I, 2], in row order (a batch may mix them with text rows: both are token rows); with no
    # input_ids, a NaFlex model's image rows (SigLIP 2), one image a row
    pages: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def patch_images(self) -> bool:
        """A batch of a NaFlex model's images: patch rows and grids, no token ids."""
        return self.pages is not None and not len(self.input_ids)

    @property
    def num_tokens(self) -> int:
        """The tokens the engine runs (an image's: its tower's)."""
        return int(self.cu_seqlens[-1])


class Scheduler:
    def __init__(
        self, max_tokens: int, max_seqs: int, bulk_tokens: int | None = None, adapters: tuple[str, ...] = ()
    ) -> None:
        """``adapters``: the model's task adapters, numbered from 1 in a batch's ``adapters`` (a work's
        task must be one of them: the worker checks it before queueing)."""
        if max_tokens <= 0 or max_seqs <= 0:
            raise ValueError("token budget and sequence cap must be positive")
        self._adapter_ids = {name: i + 1 for i, name in enumerate(adapters)}
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        # bulk batches may be cut smaller: an online request that arrives waits at most one of them
        self.bulk_tokens = min(bulk_tokens or max_tokens, max_tokens)
        self._online: deque[Work] = deque()
        self._bulk: deque[Work] = deque()  # taken only when no online work waits
        self._queued_tokens = 0

    def __len__(self) -> int:
        return len(self._online) + len(self._bulk)

    @property
    def online_waiting(self) -> int:
        return len(self._online)

    @property
    def bulk_waiting(self) -> int:
        return len(self._bulk)

    @property
    def queued_tokens(self) -> int:
        """Tokens waiting to be scheduled (load signal)."""
        return self._queued_tokens

    def push(self, work: Work, bulk: bool = False) -> None:
        (self._bulk if bulk else self._online).append(work)
        self._queued_tokens += work.pending_tokens

    def drop_expired(self, now: float) -> list[Work]:
        """Remove queued work whose deadline passed, whether or not some of its rows ran: its rows not yet
        scheduled never are (those in a running batch finish; the work is answered as expired, not with them)."""
        expired = []
        for queue in (self._online, self._bulk):
            expired += self._remove(queue, lambda work: work.batch.deadline < now)
        return expired

    def cancel(self, key: bytes) -> list[Work]:
        """Remove the queued online work that ``key`` cancels (its request's cancel key: a TokenChunk's
        ``cancel_key``); its rows not yet scheduled never are, and it is never answered. Returns that work."""
        return self._remove(self._online, lambda work: work.batch.cancel_key == key)

    def _remove(self, queue: deque[Work], gone: Callable[[Work], bool]) -> list[Work]:
        removed: list[Work] = []
        kept: list[Work] = []
        for work in queue:
            (removed if gone(work) else kept).append(work)
        if removed:
            queue.clear()
            queue.extend(kept)
            self._queued_tokens -= sum(work.pending_tokens for work in removed)
        return removed

    def withdraw_bulk(self) -> list[Work]:
        """Remove the queued bulk work none of whose rows was scheduled yet (a stopping worker hands it back)."""
        taken = [work for work in self._bulk if work.next_row == 0]
        self._bulk = deque(work for work in self._bulk if work.next_row > 0)
        self._queued_tokens -= sum(work.pending_tokens for work in taken)
        return taken

    def next_batch(self) -> Batch | None:
        """Cut the next engine batch, oldest sequences first; None when nothing waits."""
        queue = self._online or self._bulk
        if not queue:
            return None
        budget = self.max_tokens if queue is self._online else self.bulk_tokens
        slices: list[Slice] = []
        tokens = seqs = 0
        images = queue[0].batch.image_rows
        while queue and seqs < self.max_seqs:
            work = queue[0]
            if work.batch.image_rows != images:
                break  # images and token rows run through different towers: never in one batch
            cu = work.batch.cu_seqlens
            row = work.next_row
            count = work.batch.count
            # take rows of this work while they fit; always take at least one row per batch
            end = row
            while end < count and seqs < self.max_seqs:
                n = int(cu[end + 1] - cu[end])
                if tokens + n > budget and (tokens or end > row):
                    break
                tokens += n
                seqs += 1
                end += 1
            if end > row:
                slices.append(Slice(work, row, end))
                self._queued_tokens -= int(cu[end] - cu[row])
                work.next_row = end
            if work.next_row < count:
                break  # budget reached inside this work
            queue.popleft()
        return _pack(slices, self._adapter_ids)

    @staticmethod
    def complete(batch: Batch, vectors: np.ndarray | dict[str, np.ndarray]) -> list[Work]:
        """Store the engine's output ([B, dim], or a dict of outputs by kind: see ``Engine.step``);
        return the works that are now complete."""
        finished = []
        # where each slice's entries start in the batch's outputs: a vector per row (dense, sparse), per
        # token (tokens, multivector), or per span (spans, of the rows that have them); only the units
        # the batch's outputs are counted in
        at = dict.fromkeys({_UNITS.get(kind, "rows") for kind in batch.outputs}, 0)
        for s in batch.slices:
            work = s.work
            kind = work.batch.options.output
            made = vectors[kind] if isinstance(vectors, dict) else vectors
            entries = {unit: _entries(work.batch, unit, s.row_start, s.row_end) for unit in at}
            unit = _UNITS.get(kind, "rows")
            lo, hi = entries[unit]
            if work.vectors is None:
                total = _entries(work.batch, unit, 0, work.batch.count)[1]
                work.vectors = np.empty((total, made.shape[1]), dtype=np.float32)
            work.vectors[lo:hi] = made[at[unit] : at[unit] + hi - lo]
            for name, (a, b) in entries.items():
                at[name] += b - a
            work.done_rows += s.row_end - s.row_start
            if work.done_rows == work.batch.count:
                finished.append(work)
        return finished


# the entries each output kind makes, other than a vector per row
_UNITS = {"tokens": "tokens", "multivector": "tokens", "spans": "spans"}


def _entries(chunk: TokenChunk, unit: str, start: int, end: int) -> tuple[int, int]:
    """The entries of ``unit`` (rows, tokens, spans) that rows ``start`` .. ``end`` of ``chunk`` hold, as
    indices within the chunk's (a chunk without spans holds none)."""
    if unit == "rows":
        return start, end
    if unit == "tokens":
        return int(chunk.cu_seqlens[start]), int(chunk.cu_seqlens[end])
    if chunk.spans is None:
        return 0, 0
    offsets = chunk.spans.offsets
    return int(offsets[start]), int(offsets[end])


def _pack(slices: list[Slice], adapter_ids: dict[str, int] | None = None) -> Batch:
    if slices[0].work.batch.pixels is not None:
        return _pack_images(slices)
    ids, lengths, types = [], [], []
    typed = any(s.work.batch.token_types is not None for s in slices)
    for s in slices:
        b = s.work.batch
        lo, hi = b.cu_seqlens[s.row_start], b.cu_seqlens[s.row_end]
        ids.append(b.input_ids[lo:hi])
        lengths.append(np.diff(b.cu_seqlens[s.row_start : s.row_end + 1]))
        if typed:
            types.append(b.token_types[lo:hi] if b.token_types is not None else np.zeros(hi - lo, np.int32))
    all_lengths = np.concatenate(lengths)
    cu_seqlens = np.zeros(len(all_lengths) + 1, dtype=np.int32)
    np.cumsum(all_lengths, out=cu_seqlens[1:])
    token_types = np.concatenate(types).astype(np.int32, copy=False) if typed else None
    skip = None
    if any(s.work.batch.prompt_tokens for s in slices):
        skip = np.concatenate([np.full(s.row_end - s.row_start, s.work.batch.prompt_tokens, np.int32) for s in slices])
    outputs = tuple(sorted({s.work.batch.options.output for s in slices}))
    spans = _batch_spans(slices) if "spans" in outputs else None
    adapters = None
    if any(s.work.batch.options.task is not None for s in slices):
        ids_of = adapter_ids or {}
        adapters = np.concatenate(
            [np.full(s.row_end - s.row_start, ids_of.get(s.work.batch.options.task or "", 0), np.int32) for s in slices]
        )
    parts = [s.work.batch.page_rows(s.row_start, s.row_end) for s in slices if s.work.batch.pages is not None]
    pages = (np.concatenate([p for p, _ in parts]), np.concatenate([g for _, g in parts])) if parts else None
    return Batch(
        np.concatenate(ids).astype(np.int32, copy=False),
        cu_seqlens,
        slices,
        token_types,
        skip,
        outputs,
        spans,
        adapters,
        pages=pages,
    )


def _pack_images(slices: list[Slice]) -> Batch:
    """Image rows (next_batch never mixes them with token rows): their pixels stacked, their tower tokens' offsets."""
    pixels = [s.work.batch.pixels[s.row_start : s.row_end] for s in slices if s.work.batch.pixels is not None]
    lengths = np.concatenate([np.diff(s.work.batch.cu_seqlens[s.row_start : s.row_end + 1]) for s in slices])
    cu_seqlens = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    outputs = tuple(sorted({s.work.batch.options.output for s in slices}))
    return Batch(np.zeros(0, np.int32), cu_seqlens, slices, outputs=outputs, pixels=np.concatenate(pixels))


def _batch_spans(slices: list[Slice]) -> Spans:
    """The spans of a batch's rows, row-relative as each chunk has them; rows of works that ask for
    another output have none."""
    parts = [
        s.work.batch.spans.between(s.row_start, s.row_end)
        if s.work.batch.spans is not None
        else Spans(np.zeros(s.row_end - s.row_start, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))
        for s in slices
    ]
    return Spans(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("counts", "firsts", "lasts")))
