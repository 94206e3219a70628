"""The worker's options: device and dtype, batch budgets, replicas and threads, graphs, attention, load reports."""

from __future__ import annotations

from embedfleet.shared.config.option import Option, budget, declare, positive_float, positive_int

OPTIONS: tuple[Option, ...] = (
    declare(
        "--device",
        "EMBEDFLEET_DEVICE",
        "auto",
        "torch device: auto (CUDA when present), cpu, cuda, cuda:N",
        {"worker"},
        "worker",
    ),
    declare(
        "--dtype",
        "EMBEDFLEET_DTYPE",
        None,
        "compute dtype (default: float32 on CPU; on CUDA bfloat16 where config.json saves the weights so, else float16)",
        {"worker"},
        "worker",
        choices=("float32", "float16", "bfloat16"),
    ),
    declare(
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
    declare(
        "--bulk-batch-tokens",
        "EMBEDFLEET_BULK_BATCH_TOKENS",
        None,
        "token budget of engine batches of bulk-job work (default: the token budget); smaller bounds how long an "
        "online request waits behind bulk work on a slow device",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    declare(
        "--max-batch-seqs",
        "EMBEDFLEET_MAX_BATCH_SEQS",
        256,
        "max sequences in one engine batch",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    declare(
        "--replicas",
        "EMBEDFLEET_REPLICAS",
        1,
        "engine replicas: on CUDA, replicas on the one GPU sharing weights; on CPU, processes sharing the cores",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    declare(
        "--threads",
        "EMBEDFLEET_THREADS",
        None,
        "CPU threads per replica (default: all cores, split among replicas)",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    declare(
        "--graphs",
        "EMBEDFLEET_GRAPHS",
        "auto",
        "CUDA graphs: auto (on with CUDA), on, off",
        {"worker"},
        "worker",
        choices=("auto", "on", "off"),
    ),
    declare(
        "--attention",
        "EMBEDFLEET_ATTENTION",
        "auto",
        "attention backend",
        {"worker"},
        "worker",
        choices=("auto", "sdpa", "flashinfer"),
    ),
    declare(
        "--max-queued-tokens",
        "EMBEDFLEET_MAX_QUEUED_TOKENS",
        262144,
        "online tokens waiting in this worker beyond which new batches are refused (overloaded: 429)",
        {"worker"},
        "worker",
        type=positive_int,
    ),
    declare(
        "--load-interval",
        "EMBEDFLEET_LOAD_INTERVAL",
        0.05,
        "seconds between queue-depth reports to the tokenizers while work waits or runs on the worker",
        {"worker"},
        "worker",
        type=positive_float,
    ),
    declare(
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
)
