"""The gateway's options: where it listens, a request's limits, API keys and quotas, hosts, origins, jobs, search."""

from __future__ import annotations

from embedfleet.shared.config.commands import GATEWAY
from embedfleet.shared.config.option import Option, declare, non_negative_int, positive_float, positive_int

OPTIONS: tuple[Option, ...] = (
    declare("--host", "EMBEDFLEET_HOST", "127.0.0.1", "address to listen on", GATEWAY, "gateway"),
    declare("--port", "EMBEDFLEET_PORT", 8080, "HTTP port", GATEWAY, "gateway", type=int),
    declare(
        "--request-timeout",
        "EMBEDFLEET_REQUEST_TIMEOUT",
        30.0,
        "seconds a request may take",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    declare(
        "--retries",
        "EMBEDFLEET_RETRIES",
        2,
        "times the rows a dead tokenizer or worker held are sent again (embedding is idempotent)",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    declare(
        "--max-inputs",
        "EMBEDFLEET_MAX_INPUTS",
        2048,
        "max inputs in one request",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--max-input-chars",
        "EMBEDFLEET_MAX_INPUT_CHARS",
        65536,
        "max characters in one input",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
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
    declare(
        "--max-image-bytes",
        "EMBEDFLEET_MAX_IMAGE_BYTES",
        20 << 20,
        "max bytes of one image file a request sends (a data URI's payload, decoded, or a URL's body, not read "
        "past it), for a two-tower model (more: 400 naming the input, checked before it is decoded); reindex holds "
        "a job's images to it too",
        GATEWAY | {"tokenizer", "reindex"},
        "gateway",
        type=positive_int,
    ),
    declare(
        "--max-image-pixels",
        "EMBEDFLEET_MAX_IMAGE_PIXELS",
        40_000_000,
        "max width x height of one image, as its header declares them (more: 400 naming the input, before a "
        "pixel is decoded; an RGB image holds 3 bytes a pixel once decoded); reindex holds a job's images to it too",
        GATEWAY | {"tokenizer", "reindex"},
        "gateway",
        type=positive_int,
    ),
    declare(
        "--image-hosts",
        "EMBEDFLEET_IMAGE_HOSTS",
        "",
        "hosts whose image URLs requests may send, comma separated, each fetched by the gateway (exact names, any "
        "letter case: images.example.com for https on 443, images.example.com:8443, http://host[:port] for plain "
        "http); a URL of another host, scheme or port, with user info, or answered by a redirect is refused (400); "
        "none: no URL is fetched (images come as data URIs)",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--image-hosts-private",
        "EMBEDFLEET_IMAGE_HOSTS_PRIVATE",
        "",
        "hosts of --image-hosts that may resolve to loopback, private or link-local addresses (an image store of "
        "the gateway's own network), comma separated; none: an image URL whose host resolves to one is refused "
        "(400), against requests into the gateway's network and DNS rebinding",
        GATEWAY,
        "gateway",
    ),
    declare(
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
    declare(
        "--max-body-bytes",
        "EMBEDFLEET_MAX_BODY_BYTES",
        8 << 20,
        "max request body size in bytes",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--max-in-flight",
        "EMBEDFLEET_MAX_IN_FLIGHT",
        512,
        "requests handled at once, on every route but the "
        "probes (/health, /ping, GET /, /metrics, /openapi.json); more are answered 429 at once",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--max-header-bytes",
        "EMBEDFLEET_MAX_HEADER_BYTES",
        64 << 10,
        "max bytes of a request's target and header fields; more: 431, connection closed",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--max-headers",
        "EMBEDFLEET_MAX_HEADERS",
        100,
        "max header fields in a request; more: 431, connection closed",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--header-timeout",
        "EMBEDFLEET_HEADER_TIMEOUT",
        10.0,
        "seconds a client may take to send a request's line and headers, from its connection or first byte; "
        "slower: 408, connection closed",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    declare(
        "--body-timeout",
        "EMBEDFLEET_BODY_TIMEOUT",
        30.0,
        "seconds a client may take to send a request's body, from the end of its headers; slower: 408, "
        "connection closed",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
    declare(
        "--api-keys",
        "EMBEDFLEET_API_KEYS",
        "",
        "accepted API keys (Bearer), comma separated; none: no auth",
        GATEWAY,
        "gateway",
        shows_value=False,
    ),
    declare(
        "--api-keys-file",
        "EMBEDFLEET_API_KEYS_FILE",
        None,
        "file with one accepted API key per line",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--operator-keys",
        "EMBEDFLEET_OPERATOR_KEYS",
        "",
        "API keys (Bearer) that see, cancel and read every bulk "
        "job, whoever made it (any other key sees only its own), comma separated; accepted keys as well",
        GATEWAY,
        "gateway",
        shows_value=False,
    ),
    declare(
        "--operator-keys-file",
        "EMBEDFLEET_OPERATOR_KEYS_FILE",
        None,
        "file with one operator key per line",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--key-tables-file",
        "EMBEDFLEET_KEY_TABLES_FILE",
        None,
        "file naming the tables (Qdrant's collections) of the --job-sinks and --search-sink stores each API key "
        "may write and search, a line a key: KEY TABLE[,TABLE...], a name ending in * a prefix; operator keys "
        "use every table, any other key only its own (none without a line); without API keys every table",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--key-requests-per-minute",
        "EMBEDFLEET_KEY_REQUESTS_PER_MINUTE",
        0,
        "requests each API key may make a minute (429 with Retry-After beyond); 0: no limit",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    declare(
        "--key-tokens-per-minute",
        "EMBEDFLEET_KEY_TOKENS_PER_MINUTE",
        0,
        "tokens each API key may have embedded a minute (429 with Retry-After beyond); 0: no limit",
        GATEWAY,
        "gateway",
        type=non_negative_int,
    ),
    declare(
        "--open-paths",
        "EMBEDFLEET_OPEN_PATHS",
        "/health,/metrics",
        "paths served without an API key, comma separated",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--allowed-hosts",
        "EMBEDFLEET_ALLOWED_HOSTS",
        "",
        "names the gateway is served as, comma separated (.example.com: it and its subdomains; *: any, for a "
        "gateway behind a proxy that checks Host); a request whose Host names another is refused (403, against "
        "DNS rebinding); an IP address is always taken; none: localhost, .localhost, this machine's name and --host",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--allowed-origins",
        "EMBEDFLEET_ALLOWED_ORIGINS",
        "",
        "web origins (https://app.example.com) whose pages may call the gateway (CORS), comma separated; a "
        "request with another Origin header is refused (403); none: every web page; *: any",
        GATEWAY,
        "gateway",
    ),
    declare(
        "key_id_secret",
        "EMBEDFLEET_KEY_ID_SECRET",
        None,
        "the secret API keys' ids in metrics are made with (HMAC-SHA256, first 12 hex digits): the same ids "
        "across restarts and replicas; none: a random one per gateway process",
        GATEWAY,
        "gateway",
        kind="secret",
    ),
    declare(
        "--jobs-dir",
        "EMBEDFLEET_JOBS_DIR",
        None,
        "folder whose files POST /v1/jobs may name as 'path' (default: none, server-side files are refused)",
        GATEWAY,
        "gateway",
    ),
    declare(
        "--jobs-max-file-bytes",
        "EMBEDFLEET_JOBS_MAX_FILE_BYTES",
        256 << 20,
        "max bytes of a file a path job (POST /v1/jobs with 'path') names; larger: 400 (run it with reindex)",
        GATEWAY,
        "gateway",
        type=positive_int,
    ),
    declare(
        "--default-model",
        "EMBEDFLEET_DEFAULT_MODEL",
        None,
        "the served model that requests naming none use (TEI routes); default: the first served id in order "
        "(embedfleet up: its first --model)",
        GATEWAY,
        "gateway",
    ),
    declare(
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
    declare(
        "--search-model",
        "EMBEDFLEET_SEARCH_MODEL",
        None,
        "the served model whose vectors the --search-sink store holds: it embeds every query, and a request "
        "naming another is refused; default: the request's model, else --default-model",
        GATEWAY,
        "gateway",
    ),
    declare(
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
    declare(
        "--job-metrics-interval",
        "EMBEDFLEET_JOB_METRICS_INTERVAL",
        5.0,
        "seconds between reads of the bulk jobs' progress for the gateway's metrics",
        GATEWAY,
        "gateway",
        type=positive_float,
    ),
)
