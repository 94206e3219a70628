"""The replies of one engine batch as the fewest messages: one per requester, not one per request.

A requester (a gateway, a scorer, a NATS-direct client) whose requests say it reads Replies gets the
replies of each batch in one Replies message, or in as few as its NATS max_payload allows, sent to the
reply subject of the first reply it holds; each reply inside names the reply subject it answers. The
replies of one requester are those whose reply subjects share an inbox (all but their last token). A
reply alone, and every reply to a requester that does not read Replies (one of an earlier release),
goes to its own reply subject as before. A worker publishes only to reply subjects it was given (what
NATS permissions let it: ``allow_responses``). Fewer messages mean fewer publishes here, fewer
messages for nats-server to route, and fewer for the requester to take in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.protocol import Replies, encode

# the bytes a Replies message takes besides its replies (type, keys, array headers), and each reply's
# besides its payload and subject (its msgpack headers): generous bounds
_BUNDLE_BYTES = 64
_PER_REPLY_BYTES = 16


@dataclass(slots=True)
class Outgoing:
    """The replies of one batch, gathered before any is published."""

    alone: list[tuple[str, bytes]] = field(default_factory=list)  # (reply subject, payload)
    # a requester's inbox -> its replies: (reply subject, payload)
    bundled: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)

    def add(self, replies: bool, subject: str, payload: bytes) -> None:
        """A reply to ``subject``; ``replies``: its requester reads Replies."""
        if replies:
            self.bundled.setdefault(subject.rpartition(".")[0], []).append((subject, payload))
        else:
            self.alone.append((subject, payload))

    def messages(self, max_payload: int) -> list[tuple[str, bytes]]:
        """What to publish: (subject, payload) pairs, each payload within ``max_payload``."""
        out = list(self.alone)
        for items in self.bundled.values():
            group: list[tuple[str, bytes]] = []
            size = _BUNDLE_BYTES
            for subject, payload in items:
                cost = len(payload) + 4 * len(subject) + _PER_REPLY_BYTES
                if group and size + cost > max_payload:
                    out.append(_one(group))
                    group, size = [], _BUNDLE_BYTES
                group.append((subject, payload))
                size += cost
            if group:
                out.append(_one(group))
        return out


def _one(group: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """One message for ``group``: a reply alone as itself, several as Replies on the first one's subject."""
    if len(group) == 1:
        return group[0]
    return group[0][0], encode(Replies([subject for subject, _ in group], [payload for _, payload in group]))
