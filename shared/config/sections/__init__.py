"""The declarations of every option, a module per part of the stack; ``OPTIONS`` is all of them, in the order
each command's ``--help`` lists them and the table of docs/options.md has its rows."""

from __future__ import annotations

from embedfleet.shared.config.option import Option
from embedfleet.shared.config.sections import (
    actions,
    bulk,
    fleet,
    gateway,
    models,
    nats,
    observability,
    reindex,
    scorer,
    tokenizer,
    up,
    worker,
)

OPTIONS: tuple[Option, ...] = (
    *nats.OPTIONS,
    *models.OPTIONS,
    *gateway.OPTIONS,
    *fleet.OPTIONS,
    *up.OPTIONS,
    *reindex.OPTIONS,
    *tokenizer.OPTIONS,
    *worker.OPTIONS,
    *scorer.OPTIONS,
    *bulk.OPTIONS,
    *observability.OPTIONS,
    *actions.OPTIONS,
)
