"""Protocol messages: the dataclasses every service exchanges, and their limits.

Each message's wire keys and encodings are tabled in docs/protocol.md (tests/shared/protocol/test_doc.py
holds the tables to the code); its encoder and decoder are in shared/protocol/wire.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol.checks import TOKEN_DTYPE, ProtocolError, is_int
from embedfleet.shared.protocol.chunk_rows import ChunkRows
from embedfleet.shared.protocol.spans import Spans
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking, TextChunk
from embedfleet.shared.vectors.forms import FLOAT32, WIRE_FORMS

# the key layout written and read (docs/protocol.md), in which a key means one thing across all
# messages; a message of another version is refused
VERSION = 2


# vectors' dtypes on the wire are the forms' codes (shared/vectors/forms.py's WIRE_FORMS): f4 f2 i1 u1,
# and the bit-packed b1 (bytes shifted into int8) and ub1 (plain bytes), 8 components a byte
def row_width(dtype: str, dim: int) -> int:
    """Stored elements per row of ``dim`` components: ``dim``, or ceil(dim / 8) for the bit-packed forms."""
    return WIRE_FORMS[dtype].width(dim)


def row_bytes(dtype: str, dim: int) -> int:
    return WIRE_FORMS[dtype].row_bytes(dim)


MAX_DIMENSION = 1 << 20  # a vector's components: a sparse vector has one per vocabulary entry
MAX_SPARSE_TOP_K = MAX_DIMENSION

# what a request asks the model for (EmbedOptions.output):
#   "dense": one vector per input (pooled, Dense layers, Normalize);
#   "sparse": one vocabulary-sized vector per input, sent as (index, value) pairs (SPLADE, BGE-M3's lexical weights);
#   "tokens": every token's last hidden state (TEI /embed_all);
#   "multivector": one projected vector per token (ColBERT-style models, BGE-M3's colbert vectors);
#   "spans": one vector per span of the input's tokens (late chunking: shared/protocol/spans.py): the
#     mean of the span's last hidden states, then the Dense layers and Normalize
OUTPUTS = ("dense", "sparse", "tokens", "multivector", "spans")
RAGGED_OUTPUTS = ("tokens", "multivector", "spans")  # several rows per input: results carry per-input offsets
POOLED_OUTPUTS = ("dense", "spans")  # vectors made by the model's post-pooling stack: dimensions apply
SPARSE_DTYPES = tuple(form.wire for form in WIRE_FORMS.values() if form.floating)  # a sparse vector's values


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """Per-request output options, carried from the gateway to the worker."""

    normalize: bool | None = None  # None: as the model's modules.json says
    dimensions: int | None = None  # Matryoshka truncation (then renormalised when normalising)
    dtype: str = FLOAT32.wire  # a form's wire code (WIRE_FORMS): "f4" | "f2" | "i1" | "u1" | "b1" | "ub1"
    truncate: bool = True  # False: an input over the model limit is an error
    truncation_direction: str = "right"  # "right" keeps the start of an input, "left" its end
    prompt_name: str | None = None  # a prompt of the model that must exist (TEI prompt_name)
    input_type: str | None = None  # "query" / "document": the model's prompt of that name, if any
    # a task adapter of the model (jina-embeddings-v3's "retrieval.query", ...), that must exist; the
    # tokenizer resolves it (from input_type / prompt_name where none is given) before the worker reads it
    task: str | None = None
    output: str = "dense"  # one of OUTPUTS
    sparse_top_k: int | None = None  # sparse: keep the k largest values of each vector
    sparse_threshold: float | None = None  # sparse: drop values at or below this

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ProtocolError(f"options.output must be one of {', '.join(OUTPUTS)}")
        if self.sparse_top_k is not None and (
            not is_int(self.sparse_top_k) or not 0 < self.sparse_top_k <= MAX_SPARSE_TOP_K
        ):
            raise ProtocolError(f"options.sparse_top_k must be an integer in 1..{MAX_SPARSE_TOP_K}")
        if self.sparse_threshold is not None and (
            isinstance(self.sparse_threshold, bool)
            or not isinstance(self.sparse_threshold, (int, float))
            or not math.isfinite(self.sparse_threshold)
        ):
            raise ProtocolError("options.sparse_threshold must be a finite number")
        if self.output not in POOLED_OUTPUTS and self.dimensions is not None:
            raise ProtocolError("options.dimensions applies to dense and span vectors only")
        if self.output == "spans" and self.truncate is not False:
            raise ProtocolError("options.truncate must be false with output 'spans': a row cut short loses its spans")
        if self.truncation_direction not in ("right", "left"):
            raise ProtocolError("options.truncation_direction must be 'right' or 'left'")
        for name in ("prompt_name", "input_type", "task"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > 256):
                raise ProtocolError(f"options.{name} must be a short string")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ProtocolError("options.normalize must be a boolean")
        if self.dimensions is not None and (not is_int(self.dimensions) or not 0 < self.dimensions <= MAX_DIMENSION):
            raise ProtocolError("options.dimensions must be a positive integer")
        if not isinstance(self.dtype, str) or self.dtype not in WIRE_FORMS:
            raise ProtocolError(f"options.dtype must be one of {sorted(WIRE_FORMS)}")
        # after the check above: only a known (short) dtype is echoed back
        if self.output == "sparse" and self.dtype not in SPARSE_DTYPES:
            raise ProtocolError(f"sparse values are sent as {' or '.join(SPARSE_DTYPES)}, not {self.dtype!r}")
        if not isinstance(self.truncate, bool):
            raise ProtocolError("options.truncate must be a boolean")

    @property
    def form(self) -> str:
        """The name of the vector form ``dtype`` codes (shared/vectors/forms.py)."""
        return WIRE_FORMS[self.dtype].name

    def to_wire(self) -> dict[str, Any]:
        return (
            {
                "n": self.normalize,
                "d": self.dimensions,
                "dt": self.dtype,
                "tr": self.truncate,
                "td": self.truncation_direction,
                "pn": self.prompt_name,
                "it": self.input_type,
            }
            | ({} if self.task is None else {"tk": self.task})
            | (
                {}
                if self.output == "dense"
                else {"out": self.output, "sk": self.sparse_top_k, "sth": self.sparse_threshold}
            )
        )

    @classmethod
    def from_wire(cls, m: Any) -> EmbedOptions:
        if not isinstance(m, dict):
            raise ProtocolError("options must be a map")
        output = m.get("out", "dense")
        sparse = output != "dense"  # the sparse settings mean nothing to dense vectors: read only with another output
        return cls(
            normalize=m.get("n"),
            dimensions=m.get("d"),
            dtype=m.get("dt", FLOAT32.wire),
            truncate=m.get("tr", True),
            truncation_direction=m.get("td", "right"),
            prompt_name=m.get("pn"),
            input_type=m.get("it"),
            task=m.get("tk"),
            output=output,
            sparse_top_k=m.get("sk") if sparse else None,
            sparse_threshold=m.get("sth") if sparse else None,
        )


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """gateway -> tokenizer: texts (or already tokenized inputs) to embed with one model."""

    id: str
    model: str
    texts: list[str]
    deadline: float  # unix time, seconds
    options: EmbedOptions = field(default_factory=EmbedOptions)
    token_ids: list[np.ndarray] | None = None  # inputs given as token IDs ([n] int32 each); texts empty
    pairs: list[tuple[str, str]] | None = None  # (query, document) inputs for cross-encoders; texts empty
    # workers say which rows they hold (Held replies): a requester asks while several workers serve the
    # model (with one, its death loses every missing row anyway, and the messages are saved)
    held: bool = False
    # the requester reads Replies and its reply subjects are <its inbox>.<one token>: a worker may answer
    # several of its requests in one message (and a tokenizer send their batches in one), grouped by that
    # inbox. False: each reply goes alone; a plain ``_INBOX.<id>`` reply shares its prefix with every
    # other client's, so grouping by it would send one client's answers to another's subject
    replies: bool = False
    # output "spans": per text, the ranges of its content tokens pooled into one vector each (late chunking)
    spans: Spans | None = None
    # a secret of the requester (random bytes: MIN_CANCEL_KEY..MAX_CANCEL_KEY): a Cancel that carries it drops
    # the request's rows not yet sent or started; the tokenizer passes it on to each chunk. None: never cancelled
    cancel_key: bytes | None = None
    # images to embed with a two-tower model, as files (PNG, JPEG, WebP, GIF; the gateway checked their
    # headers): the tokenizer decodes and prepares them; texts empty
    images: list[bytes] | None = None
    # workers (their ids) the requester took for stopped: silent on its pings with their connections open,
    # they may still look live to a tokenizer (their last load reports not stale yet); the tokenizer sends
    # them none of this request's rows while it knows another worker. At most MAX_AVOID
    avoid: tuple[str, ...] = ()

    TYPE = "embed"

    @property
    def count(self) -> int:
        if self.images is not None:
            return len(self.images)
        if self.token_ids is not None:
            return len(self.token_ids)
        return len(self.pairs) if self.pairs is not None else len(self.texts)


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """tokenizer -> worker: rows [start, start + count) of request ``id``, tokenized and packed without
    padding (a worker batches several chunks into one engine batch)."""

    id: str
    model: str
    start: int
    total: int  # rows in the whole request (bulk work with spans: its start and total count spans, as doc_ids)
    input_ids: np.ndarray  # [T] int32
    cu_seqlens: np.ndarray  # [count + 1] int32, cu_seqlens[0] == 0, cu_seqlens[-1] == T
    deadline: float
    options: EmbedOptions = field(default_factory=EmbedOptions)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage so far
    token_types: np.ndarray | None = None  # [T] int32 segment ids (pairs); None: all 0
    job: str | None = None  # bulk work: the job, whose results go to JetStream, not to a reply subject
    batch: int = 0  # bulk work: the job batch these rows belong to
    doc_ids: list[str] | None = None  # bulk work: the documents of these rows (with spans: of its spans)
    prompt_tokens: int = 0  # leading tokens of every row that pooling skips (a model's include_prompt=false)
    held: bool = False  # online work: the worker says it holds these rows (a Held message) as they arrive
    replies: bool = False  # online work: the requester reads Replies (its EmbedRequest asked)
    spans: Spans | None = None  # output "spans": per row, the ranges of its tokens pooled into one vector each
    # bulk work of a chunked job: the chunk each row is (rows: the job batch's chunks); with spans (late
    # chunking) each row is a window and each span a chunk, whose vector is a result row
    chunks: ChunkRows | None = None
    cancel_key: bytes | None = None  # online work: its request's (EmbedRequest.cancel_key)
    # image rows: [count, C, H, W] uint8, prepared by the tokenizer (resized and cropped, not normalised);
    # input_ids is then empty and cu_seqlens counts each image as the tokens its tower runs (patches + 1),
    # so budgets and load weigh images as the engine's work
    pixels: np.ndarray | None = None
    # a page model's rows (ColQwen2): each row is a text holding one image's tokens, and its image comes
    # as patch rows [P, C * patch * patch] uint8 (resized as the processor resizes, not normalised), row i's
    # ``page_grids[i]`` = (gh, gw) patches of them, in row order
    # (the same fields with no input_ids: a NaFlex model's image rows (SigLIP 2), each image at its own grid,
    # cu_seqlens counting each row's patches)
    pages: np.ndarray | None = None
    page_grids: np.ndarray | None = None  # [count, 2] int32

    TYPE = "tokens"

    @property
    def image_rows(self) -> bool:
        """Rows that run an image tower (pixels, or patch rows without token ids), not the token path."""
        return self.pixels is not None or (self.pages is not None and not len(self.input_ids))

    @property
    def count(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def num_tokens(self) -> int:
        """The tokens the engine runs for these rows (an image's: its tower's)."""
        return int(self.cu_seqlens[-1])

    def page_rows(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The patch rows and grids of rows ``start`` .. ``end`` of a page chunk."""
        assert self.pages is not None and self.page_grids is not None
        offsets = np.concatenate([[0], np.cumsum(self.page_grids[:, 0].astype(np.int64) * self.page_grids[:, 1])])
        return self.pages[offsets[start] : offsets[end]], self.page_grids[start:end]


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """worker -> gateway: vectors for rows [start, start + count) of request ``id``."""

    id: str
    start: int
    total: int
    dim: int
    dtype: str
    data: bytes  # count rows of row_width(dtype, dim) little-endian values of dtype
    tokens: int  # real tokens behind these rows (for usage)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage: tokenize, queue, inference
    # ragged results (sparse, tokens, multivector): input i of this part owns entries offsets[i]:offsets[i + 1]
    # of the payload (vectors for tokens/multivector, values for sparse); [count + 1] int32, offsets[0] == 0
    offsets: np.ndarray | None = None
    indices: np.ndarray | None = None  # sparse: [entries] int32 vocabulary index of each value, below dim

    TYPE = "result"

    @property
    def count(self) -> int:
        if self.offsets is not None:
            return len(self.offsets) - 1
        return len(self.data) // row_bytes(self.dtype, self.dim)

    def array(self) -> np.ndarray:
        """[rows, row_width(dtype, dim)] read-only view of the payload (sparse: [entries] values)."""
        return _payload(self.data, self.dtype, self.dim, self.indices is not None)

    def ragged(self) -> list:
        """Per input: its [n, width] vectors (tokens, multivector), or its (indices, values) (sparse)."""
        return _split(self.array(), self.offsets, self.indices)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Any service -> requester: the request (or part of it) failed."""

    id: str
    code: ErrorCode
    message: str
    row: int | None = None  # the index, within the request, of the input that failed; None: not about one input

    TYPE = "error"


@dataclass(frozen=True, slots=True)
class Replies:
    """worker -> requester, on the reply subject of one of the replies it holds: several replies in one
    message, each with the reply subject it answers (the replies of one batch to one requester go as
    one message, not one each). ``messages[i]`` is an encoded reply (an EmbedResult or an ErrorReply)."""

    subjects: list[str]
    messages: list[bytes]

    TYPE = "replies"


@dataclass(frozen=True, slots=True)
class Requests:
    """Several requests of one requester in one message (a lone request goes as itself): gateway ->
    tokenizer on a model's embed subject (what a gateway published in one pass of its event loop:
    encoded EmbedRequests), tokenizer -> worker on a tokens subject (a group's token batches for one
    requester that reads Replies: encoded TokenChunks). ``messages[i]`` is answered on ``subjects[i]``,
    its trace context ``traces[i]`` (a traceparent, "" for none). The message's own reply subject is
    ``subjects[0]``: the receiver may publish only there (NATS ``allow_responses``), so it answers any
    other request of the bundle there, inside a Replies; every subject shares one inbox (all but its
    last token)."""

    subjects: list[str]
    traces: list[str]
    messages: list[bytes]

    TYPE = "requests"


@dataclass(frozen=True, slots=True)
class Cancel:
    """requester -> every tokenizer and worker of a model (<P>.v1.cancel.<model>, no queue group): nobody
    reads request ``id``'s answer any more (its HTTP client left, its deadline passed, or it failed), so
    its rows not yet sent (tokenizer) or not yet started (worker) are dropped, unanswered.

    Only work that carries ``key``, the request's own cancel key, is touched: the key is a random secret
    of the requester, sent only inside its request, so an id read from a log or guessed cancels nothing.
    A receiver remembers the key until ``deadline`` (the request's): rows that come after their Cancel
    (a tokenizer still sending them, a resend) are dropped too."""

    id: str  # the request's (for the log: the key alone says what is cancelled)
    key: bytes
    deadline: float  # unix time, seconds

    TYPE = "cancel"


# a header of an empty message that asks only whether anyone subscribes to its subject (a tokenizer's
# check that its token chunks reached a worker): a worker ignores such a message
DELIVERY_CHECK = "Embedfleet-Check"


@dataclass(frozen=True, slots=True)
class Held:
    """worker -> requester, as a token chunk arrives: rows ``start``..``start + rows`` of request ``id``
    are held by worker ``holder``; should it die, the requester sends those rows again."""

    id: str
    start: int
    rows: int
    holder: str  # the worker's id (its load reports' and its micro-service metadata's "instance")

    TYPE = "held"


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """gateway -> tokenizer: show how texts tokenize (TEI /tokenize)."""

    id: str
    model: str
    texts: list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None

    TYPE = "tokenize"


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    """tokenizer -> gateway: per text, its tokens as (id, text, special, start, stop)."""

    id: str
    tokens: list[list[tuple[int, str, bool, int | None, int | None]]]

    TYPE = "tokenized"


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """gateway -> tokenizer: token IDs back to text (TEI /decode)."""

    id: str
    model: str
    ids: list[np.ndarray]  # per sequence, [n] int32 token IDs
    skip_special_tokens: bool = True

    TYPE = "decode"


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """tokenizer -> gateway: one text per sequence of the request."""

    id: str
    texts: list[str]

    TYPE = "decoded"


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """gateway -> tokenizer: where each text is cut into chunks of ``spec`` (the layout, not the chunks'
    texts), with the room the prompt leaves: the chunks are embedded with that prompt before them."""

    id: str
    model: str
    texts: list[str]
    spec: ChunkSpec
    prompt_name: str | None = None  # as EmbedOptions has them: the prompt the chunks are embedded with
    input_type: str | None = None
    task: str | None = None  # the task adapter asked for, whose prompt the chunks may get (EmbedOptions.task)

    TYPE = "chunk"

    @property
    def prompt_options(self) -> EmbedOptions:
        return EmbedOptions(prompt_name=self.prompt_name, input_type=self.input_type, task=self.task)


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """tokenizer -> gateway: the chunks of each text of a ChunkRequest, in order: input i owns chunks
    ``sum(counts[:i])`` .. ``sum(counts[:i + 1])``, chunk j being ``text[starts[j]:ends[j]]``, the text's
    content tokens ``firsts[j]`` .. ``lasts[j]`` (as services/tokenizer/chunking.py cuts them)."""

    id: str
    counts: np.ndarray  # [inputs] int32, chunks of each input, >= 1
    tokens: np.ndarray  # [inputs] int32, content tokens of each whole input (no special tokens, no prompt)
    starts: np.ndarray  # [chunks] int32, characters
    ends: np.ndarray  # [chunks] int32, characters, >= starts
    firsts: np.ndarray  # [chunks] int32, token indices
    lasts: np.ndarray  # [chunks] int32, token indices (exclusive), >= firsts, <= the input's tokens
    # content tokens one sequence holds besides the model's special tokens and the request's prompt (what
    # late chunking's windows may hold); 0: not said (a tokenizer of an earlier release)
    room: int = 0

    TYPE = "chunked"

    @classmethod
    def of(cls, id: str, chunks: list[list[TextChunk]], tokens: list[int], room: int = 0) -> ChunkLayout:
        """The layout of texts cut into ``chunks`` (per text, in order), of ``tokens`` content tokens each."""
        flat = [c for each in chunks for c in each]

        def column(name: str) -> np.ndarray:
            return np.fromiter((getattr(c, name) for c in flat), dtype=TOKEN_DTYPE, count=len(flat))

        return cls(
            id,
            np.array([len(each) for each in chunks], TOKEN_DTYPE),
            np.array(tokens, TOKEN_DTYPE),
            column("start"),
            column("end"),
            column("first"),
            column("last"),
            room,
        )

    def chunks(self) -> list[list[TextChunk]]:
        """Per input, its chunks."""
        flat = [
            TextChunk(*c)
            for c in zip(self.starts.tolist(), self.ends.tolist(), self.firsts.tolist(), self.lasts.tolist())
        ]
        bounds = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)]).tolist()
        return [flat[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True, slots=True)
class JobBatch:
    """client -> tokenizers (JetStream subject <prefix>.v1.jobs.<model>): one batch of a bulk job.

    Wire format, for publishers in any language (a msgpack map; every key in docs/protocol.md):
    ``{"v": 2, "t": "job", "jb": JOB_ID, "bi": BATCH_INDEX, "m": MODEL, "di": [DOC_ID, ...],
    "x": [TEXT, ...], "o": {"it": "document"|"query"|null, "d": DIMENSIONS|null, "n": NORMALIZE|null,
    "dt": "f4"|"f2"|"i1"|"u1"|"b1"|"ub1", "tr": true, "out": "dense"|"sparse"|"multivector"}}`` ("out" optional;
    chunked: ``"sz": SIZE, "ov": OVERLAP, "bd": "token"|"sentence"``, optional ``"lc": false, "wt": WITH_TEXT``;
    a batch of images: ``"im": [FILE, ...]`` and ``"x": []``), published with header
    ``Nats-Msg-Id: JOB_ID:BATCH_INDEX``.
    """

    id: str  # the job
    batch: int
    model: str
    doc_ids: list[str]
    texts: list[str]  # empty in a batch of images
    options: EmbedOptions = field(default_factory=EmbedOptions)
    chunking: JobChunking | None = None  # each document cut into chunks, a row (and a vector) each (texts only)
    # a two-tower model's image documents, one file (PNG, JPEG, WebP, GIF) each, checked against the
    # submitter's limits by their headers; the tokenizer decodes them under its own
    images: list[bytes] | None = None

    TYPE = "job"

    @property
    def count(self) -> int:
        """The batch's documents."""
        return len(self.doc_ids)


@dataclass(frozen=True, slots=True)
class JobResult:
    """worker -> the job's collector (JetStream subject <prefix>.v1.results.<job>): vectors of some documents."""

    id: str  # the job
    batch: int
    start: int  # first row within the batch
    doc_ids: list[str]
    dim: int
    dtype: str
    data: bytes  # len(doc_ids) rows of row_width(dtype, dim) little-endian values (ragged: see EmbedResult)
    tokens: int
    offsets: np.ndarray | None = None  # as EmbedResult's
    indices: np.ndarray | None = None
    chunks: ChunkRows | None = None  # a chunked job's: the chunk each row is (doc_ids: each row's document)

    TYPE = "jobresult"

    def array(self) -> np.ndarray:
        return _payload(self.data, self.dtype, self.dim, self.indices is not None)

    def ragged(self) -> list:
        return _split(self.array(), self.offsets, self.indices)


def _payload(data: bytes, dtype: str, dim: int, sparse: bool) -> np.ndarray:
    values = np.frombuffer(data, dtype=WIRE_FORMS[dtype].dtype)
    return values if sparse else values.reshape(-1, row_width(dtype, dim))


def _split(values: np.ndarray, offsets: np.ndarray | None, indices: np.ndarray | None) -> list:
    if offsets is None:
        raise ValueError("not a ragged result")
    bounds = offsets.tolist()
    if indices is None:
        return [values[a:b] for a, b in itertools.pairwise(bounds)]
    return [(indices[a:b], values[a:b]) for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """worker -> tokenizers, every few tens of milliseconds (less often while idle): how much work waits on it."""

    id: str  # the worker's id
    model: str
    subject: str  # where to send it token batches directly
    queued_tokens: int  # tokens waiting or running
    interval: float  # seconds until the next report
    leaving: bool = False  # stopping: send it nothing more
    rate: float = 0.0  # recent tokens/s of its engine (0: not measured yet)

    TYPE = "load"


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """gateway -> scorer: rank ``texts`` by relevance to ``query``."""

    id: str
    model: str
    query: str
    texts: list[str]
    deadline: float
    top_n: int | None = None
    raw_scores: bool = False  # cross-encoders: logits instead of sigmoid scores
    truncate: bool = True  # False: a pair or candidate over the model's limit is an error
    vectors: np.ndarray | None = None  # [n, dim] float32 candidates already embedded (bi-encoders); texts empty
    return_text: bool = False  # the answer carries the ranked candidates' texts

    TYPE = "rerank"

    @property
    def count(self) -> int:
        return len(self.vectors) if self.vectors is not None else len(self.texts)


@dataclass(frozen=True, slots=True)
class RerankResult:
    """scorer -> gateway: candidate indices, best first, with their scores."""

    id: str
    indices: np.ndarray  # [n] int32, into the request's texts
    scores: np.ndarray  # [n] float32, aligned with indices
    texts: list[str] | None = None  # the ranked candidates' texts, when the request asked for them

    TYPE = "ranked"
