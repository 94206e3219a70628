"""The tokenizer's options: the batches it sends workers, prompts, threads, routing, fast tokenizer, chunk limits."""

from __future__ import annotations

from embedfleet.shared.config.option import Option, declare, positive_int

OPTIONS: tuple[Option, ...] = (
    declare(
        "--chunk-tokens",
        "EMBEDFLEET_CHUNK_TOKENS",
        8192,
        "max tokens per batch sent to a worker",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    declare(
        "--chunk-seqs",
        "EMBEDFLEET_CHUNK_SEQS",
        256,
        "max sequences per batch sent to a worker",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    declare(
        "--prompts",
        "EMBEDFLEET_PROMPTS",
        "",
        'prompts by input type, as JSON: {"query": "query: ", "document": "passage: "} (added to the model\'s own)',
        {"tokenizer"},
        "tokenizer",
    ),
    declare(
        "--threads",
        "EMBEDFLEET_TOKENIZER_THREADS",
        None,
        "tokenizer threads (default: all cores)",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
    declare(
        "--routing",
        "EMBEDFLEET_ROUTING",
        "load",
        "load: each batch to the least-loaded live worker; queue: the workers' shared queue group",
        {"tokenizer"},
        "tokenizer",
        choices=("load", "queue"),
    ),
    declare(
        "--fast-tokenizer",
        "EMBEDFLEET_FAST_TOKENIZER",
        "auto",
        "auto: texts tokenized with kitoken (the extra 'fast-tokenizer') when it is installed and matches the "
        "model's tokenizers token for token on a built-in corpus at start-up; off: tokenizers only",
        {"tokenizer"},
        "tokenizer",
        choices=("auto", "off"),
    ),
    declare(
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
    declare(
        "--bulk-ahead",
        "EMBEDFLEET_BULK_AHEAD",
        256,
        "bulk token batches the tokenizers may queue ahead of the workers before they wait",
        {"tokenizer"},
        "tokenizer",
        type=positive_int,
    ),
)
