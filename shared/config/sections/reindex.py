"""reindex's options: where the vectors go (a file or a sink), the model, chunking, how the job is followed."""

from __future__ import annotations

from embedfleet.shared.config.option import Option, declare, positive_float, positive_int
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES

OPTIONS: tuple[Option, ...] = (
    declare(
        "--out",
        None,
        None,
        "output: .npy (with .ids.json beside it) or .parquet; .npz for sparse and multivector",
        {"jobs fetch"},
        "reindex",
        required=True,
    ),
    declare(
        "--out",
        None,
        None,
        "output file: .npy (with .ids.json beside it) or .parquet; .npz for sparse and multivector; none: only "
        "--sink (one of the two is needed)",
        {"reindex"},
        "reindex",
    ),
    declare(
        "--sink",
        "EMBEDFLEET_SINK",
        None,
        "also (or only) write the rows into a vector store as they are collected: postgresql://…?table=NAME "
        "(pgvector), lancedb:///path?table=NAME or qdrant://HOST:PORT?collection=NAME (or qdrant:///path); a "
        "password in the URL is never shown",
        {"reindex"},
        "reindex",
        shows_value=False,
    ),
    declare(
        "--model",
        "EMBEDFLEET_MODEL_NAME",
        None,
        "the served model id; default: the default model of the stack `embedfleet up` recorded (its gateway's), "
        "else the fleet's only model",
        {"reindex"},
        "reindex",
    ),
    declare(
        "--batch-size", "EMBEDFLEET_JOB_BATCH", 64, "documents per job batch", {"reindex"}, "reindex", type=positive_int
    ),
    declare(
        "--input-type",
        "EMBEDFLEET_INPUT_TYPE",
        None,
        "query or document (selects the model's prompt)",
        {"reindex"},
        "reindex",
    ),
    declare(
        "--embedding-type",
        "EMBEDFLEET_EMBEDDING_TYPE",
        "float",
        "vector form written: float (float32), float16, int8, uint8, binary or ubinary (see docs/http-api.md, Vector forms)",
        {"reindex"},
        "reindex",
        choices=tuple(EMBEDDING_TYPES),
    ),
    declare(
        "--output",
        "EMBEDFLEET_JOB_OUTPUT",
        "dense",
        "what to write: dense vectors, sparse vectors (SPLADE, BGE-M3) or multivector (a vector per token); "
        "sparse and multivector go to .npz",
        {"reindex"},
        "reindex",
        choices=("dense", "sparse", "multivector"),
    ),
    declare(
        "--chunk-size",
        "EMBEDFLEET_CHUNK_SIZE",
        None,
        "cut every document into chunks of at most this many tokens of text, a vector each (a row a chunk, with "
        "its document's id, chunk, start and end); at most the model's limit less its special tokens and prompt",
        {"reindex"},
        "reindex",
        type=int,
    ),
    declare(
        "--chunk-overlap",
        "EMBEDFLEET_CHUNK_OVERLAP",
        None,
        "tokens consecutive chunks of a document share at most, below --chunk-size (default 0)",
        {"reindex"},
        "reindex",
        type=int,
    ),
    declare(
        "--chunk-boundary",
        "EMBEDFLEET_CHUNK_BOUNDARY",
        None,
        "where chunks are cut: token (between words, the default) or sentence (at a sentence end where one "
        "keeps the chunk half full)",
        {"reindex"},
        "reindex",
        choices=("token", "sentence"),
    ),
    declare(
        "--late-chunking",
        None,
        False,
        "late chunking: each chunk's vector pooled from one forward over the document around it (windows of the "
        "model's room; one forward a window)",
        {"reindex"},
        "reindex",
        kind="switch",
    ),
    declare(
        "--with-text",
        None,
        False,
        "store each chunk's text beside its vector (a text column); with --sink, each document's text when "
        "there are no chunks",
        {"reindex"},
        "reindex",
        kind="switch",
    ),
    declare(
        "--job-id",
        None,
        None,
        "job id (default: derived from the input, model and form, so a rerun resumes)",
        {"reindex"},
        "reindex",
    ),
    declare(
        "--stall-timeout",
        "EMBEDFLEET_STALL_TIMEOUT",
        300.0,
        "give up after this many seconds without progress",
        {"reindex"},
        "reindex",
        type=positive_float,
    ),
    declare(
        "--results-check",
        "EMBEDFLEET_RESULTS_CHECK",
        5.0,
        "seconds without a result after which reindex asks whether its results consumer is still there (and "
        "opens it again if not)",
        {"reindex"},
        "reindex",
        type=positive_float,
    ),
    declare("--quiet", None, False, "no progress bar", {"reindex"}, "reindex", kind="switch"),
)
