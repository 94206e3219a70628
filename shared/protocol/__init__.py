"""The wire protocol: every message between services, and its msgpack codec.

Messages are msgpack maps with ``v`` (protocol version, VERSION) and ``t`` (message type); docs/protocol.md
tables every message's keys and their encodings, and says which versions are read. Token IDs and
vectors travel as raw little-endian bytes (``<i4``, ``<f4``, ``<f2``), never as lists of numbers.
Everything read from NATS is untrusted: :func:`decode` checks types, sizes and invariants before
anything is allocated from it, and raises :class:`ProtocolError` otherwise.

Flow of one embedding request split into k chunks::

    gateway --EmbedRequest--> tokenizer --TokenChunk x k--> worker(s) --Held x k, EmbedResult x >=k--> gateway

Long texts, chunked: the gateway first asks a tokenizer where they are cut (ChunkRequest -> ChunkLayout),
then embeds the chunks' texts as one ordinary EmbedRequest; late chunking embeds windows of the texts
instead, each with the spans of its chunks (output "spans": a vector per span). A chunked bulk job's
tokenizer cuts each document of a JobBatch and sends its chunks as rows; its TokenChunks and JobResults
say which chunk of which document each row is (ChunkRows). A bulk job of images (a two-tower model's)
carries its files in its JobBatches (``images``); the tokenizer sends their prepared pixels as image rows.

The gateway's reply subject travels with the request, so workers answer the gateway directly. A requester
that gives up a request (its client left, its deadline passed) sends a Cancel with the request's cancel key:
tokenizers and workers drop its rows not yet sent or started.
"""

from embedfleet.shared.protocol.checks import (
    MAX_AVOID,
    MAX_BUNDLE,
    MAX_CANCEL_KEY,
    MAX_ID,
    MAX_NAME,
    MAX_ROWS,
    MAX_STAGES,
    MIN_CANCEL_KEY,
    TOKEN_DTYPE,
    ProtocolError,
)
from embedfleet.shared.protocol.chunk_rows import ChunkRows
from embedfleet.shared.protocol.codec import Message, decode, decode_as, encode
from embedfleet.shared.protocol.messages import (
    DELIVERY_CHECK,
    MAX_DIMENSION,
    OUTPUTS,
    POOLED_OUTPUTS,
    RAGGED_OUTPUTS,
    SPARSE_DTYPES,
    VERSION,
    Cancel,
    ChunkLayout,
    ChunkRequest,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    JobBatch,
    JobResult,
    LoadReport,
    Replies,
    Requests,
    RerankRequest,
    RerankResult,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    row_bytes,
    row_width,
)
from embedfleet.shared.protocol.spans import Spans

__all__ = [
    "DELIVERY_CHECK",
    "MAX_BUNDLE",
    "MAX_AVOID",
    "MAX_CANCEL_KEY",
    "MIN_CANCEL_KEY",
    "MAX_DIMENSION",
    "OUTPUTS",
    "POOLED_OUTPUTS",
    "RAGGED_OUTPUTS",
    "Spans",
    "SPARSE_DTYPES",
    "MAX_ID",
    "MAX_NAME",
    "MAX_ROWS",
    "MAX_STAGES",
    "TOKEN_DTYPE",
    "VERSION",
    "Cancel",
    "ChunkLayout",
    "ChunkRequest",
    "ChunkRows",
    "DecodeRequest",
    "DecodeResult",
    "EmbedOptions",
    "EmbedRequest",
    "EmbedResult",
    "ErrorReply",
    "Held",
    "JobBatch",
    "JobResult",
    "LoadReport",
    "Message",
    "Replies",
    "Requests",
    "ProtocolError",
    "RerankRequest",
    "RerankResult",
    "TokenChunk",
    "TokenizeRequest",
    "TokenizeResult",
    "decode",
    "decode_as",
    "encode",
    "row_bytes",
    "row_width",
]
