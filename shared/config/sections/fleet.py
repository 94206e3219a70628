"""Options for watching the fleet (who serves what, who died): how often tokenizers and workers are pinged."""

from __future__ import annotations

from embedfleet.shared.config.commands import GATEWAY
from embedfleet.shared.config.option import Option, declare, positive_float

OPTIONS: tuple[Option, ...] = (
    declare(
        "--discovery-interval",
        "EMBEDFLEET_DISCOVERY_INTERVAL",
        1.0,
        "seconds between pings of the tokenizers and workers (5 times that while no request came since the last "
        "ping); one silent for 3 intervals and 3 pings is taken for dead and the rows it held are sent again",
        GATEWAY | {"scorer"},
        "fleet",
        type=positive_float,
    ),
    declare(
        "--discovery-wait",
        "EMBEDFLEET_DISCOVERY_WAIT",
        0.25,
        "seconds a ping gathers replies",
        GATEWAY | {"scorer"},
        "fleet",
        type=positive_float,
    ),
)
