"""The replies of one engine batch as the fewest messages: one per requester, not one per request.

A requester (a gateway, a scorer, a NATS-direct client) that names a subject for Replies on its
requests gets the replies of each batch there in one Replies message, or in as few as its NATS
max_payload allows; each reply inside names the reply subject it answers. A reply alone, and every
reply to a requester that named no such subject (one of an earlier release), goes to its own reply
subject as before. Fewer messages mean fewer publishes here, fewer messages for nats-server to route,
and fewer for the requester to take in.
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
    # a requester's subject for Replies -> its replies: (reply subject, payload)
    bundled: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)

    def add(self, replies: str | None, subject: str, payload: bytes) -> None:
        if replies is None:
            self.alone.append((subject, payload))
        else:
            self.bundled.setdefault(replies, []).append((subject, payload))

    def messages(self, max_payload: int) -> list[tuple[str, bytes]]:
        """What to publish: (subject, payload) pairs, each payload within ``max_payload``."""
        out = list(self.alone)
        for replies, items in self.bundled.items():
            group: list[tuple[str, bytes]] = []
            size = _BUNDLE_BYTES
            for subject, payload in items:
                cost = len(payload) + 4 * len(subject) + _PER_REPLY_BYTES
                if group and size + cost > max_payload:
                    out.append(_one(replies, group))
                    group, size = [], _BUNDLE_BYTES
                group.append((subject, payload))
                size += cost
            if group:
                out.append(_one(replies, group))
        return out


def _one(replies: str, group: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """One message for ``group``: a reply alone as itself (on its own subject), several as Replies."""
    if len(group) == 1:
        return group[0]
    return replies, encode(Replies([subject for subject, _ in group], [payload for _, payload in group]))
