"""Every ``embedfleet`` command, and the sets of them that options are declared for (those that meet NATS,
the services, those traced…): the sections in shared/config/sections/ name these, not lists of their own."""

from __future__ import annotations

# every command, in the order the table of docs/options.md names them; "jobs purge", "jobs cancel" and "jobs
# fetch" are the actions of "jobs" (they take its options again, see registry.add_options)
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
