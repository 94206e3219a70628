"""The replies of one engine batch as the fewest messages: one per requester, not one per request.

A requester (a gateway, a scorer, a NATS-direct client) whose requests say it reads Replies gets the
replies of each batch in one Replies message, or in as few as its NATS max_payload allows, sent to the
carrier of the first reply it holds; each reply inside names the reply subject it answers. The
replies of one requester are those whose reply subjects share an inbox (all but their last token). A
reply alone goes to its own reply subject, and so does every reply to a requester that does not read
Replies. A worker publishes only to the reply subjects of the messages it was given (what NATS
permissions let it: ``allow_responses``): a reply's carrier is that of the message that brought its
request (its own reply subject, unless the request came in a Requests: shared/nats/bundles.py). Fewer
messages mean fewer publishes here, fewer messages for nats-server to route, and fewer for the
requester to take in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embedfleet.shared.nats.bundles import answer
from embedfleet.shared.protocol import Replies, encode

# the bytes a Replies message takes besides its replies (type, keys, array headers), and each reply's
# besides its payload and subject (its msgpack headers): generous bounds
_BUNDLE_BYTES = 64
_PER_REPLY_BYTES = 16


@dataclass(slots=True)
class Outgoing:
    """The replies of one batch, gathered before any is published."""

    alone: list[tuple[str, bytes]] = field(default_factory=list)  # (subject, payload) as published
    # a requester's inbox -> its replies: (reply subject, payload, carrier)
    bundled: dict[str, list[tuple[str, bytes, str]]] = field(default_factory=dict)

    def add(self, replies: bool, subject: str, payload: bytes, carrier: str = "") -> None:
        """A reply to ``subject``; ``replies``: its requester reads Replies; ``carrier``: the subject this
        process may answer it on, when not ``subject`` itself."""
        if replies:
            self.bundled.setdefault(subject.rpartition(".")[0], []).append((subject, payload, carrier or subject))
        else:
            self.alone.append(answer(subject, carrier or subject, payload))

    def messages(self, max_payload: int) -> list[tuple[str, bytes]]:
        """What to publish: (subject, payload) pairs, each payload within ``max_payload``."""
        out = list(self.alone)
        for items in self.bundled.values():
            group: list[tuple[str, bytes, str]] = []
            size = _BUNDLE_BYTES
            for subject, payload, carrier in items:
                cost = len(payload) + 4 * len(subject) + _PER_REPLY_BYTES
                if group and size + cost > max_payload:
                    out.append(_one(group))
                    group, size = [], _BUNDLE_BYTES
                group.append((subject, payload, carrier))
                size += cost
            if group:
                out.append(_one(group))
        return out


def _one(group: list[tuple[str, bytes, str]]) -> tuple[str, bytes]:
    """One message for ``group``, on its first reply's carrier: a reply alone as itself where it may go
    so, several (or one that may not) as Replies."""
    subject, payload, carrier = group[0]
    if len(group) == 1:
        return answer(subject, carrier, payload)
    return carrier, encode(Replies([s for s, _, _ in group], [p for _, p, _ in group]))
