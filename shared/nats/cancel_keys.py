"""The cancel keys a tokenizer or worker was sent (shared/protocol's Cancel), remembered for a while.

A Cancel may come before the rows it drops (a tokenizer still sends them; a requester sends rows again):
each key is kept until its request's deadline, so those rows are dropped as they come. Held on one event
loop; no NATS here.
"""

from __future__ import annotations

import logging

from embedfleet.shared.protocol import Cancel, ProtocolError, decode_as

log = logging.getLogger("embedfleet.cancel")

# keys held at most: past it the oldest is forgotten (its late rows then run, as with no cancel at all).
# A key and its entry take ~150 bytes: the whole book stays under ~10 MB
CAPACITY = 65_536
# seconds a key is kept at most, whatever deadline its Cancel names
LONGEST = 600.0
# seconds between sweeps of the keys whose deadline passed
_SWEEP_EVERY = 1.0


class CancelKeys:
    """Cancel keys, each until its deadline (unix seconds), at most ``capacity`` of them."""

    def __init__(self, capacity: int = CAPACITY, longest: float = LONGEST) -> None:
        self._capacity = capacity
        self._longest = longest
        self._until: dict[bytes, float] = {}  # in the order added: the first is the oldest
        self._swept = 0.0

    def __len__(self) -> int:
        return len(self._until)

    def take(self, data: bytes, now: float) -> Cancel | None:
        """A Cancel message's key added (None, and nothing added: the message is no valid Cancel)."""
        try:
            cancel = decode_as(data, Cancel)
        except ProtocolError as exc:
            log.debug("bad cancel: %s", exc)
            return None
        self.add(cancel.key, cancel.deadline, now)
        return cancel

    def add(self, key: bytes, deadline: float, now: float) -> None:
        if now - self._swept >= _SWEEP_EVERY:
            self._until = {k: t for k, t in self._until.items() if t >= now}
            self._swept = now
        self._until.pop(key, None)
        while len(self._until) >= self._capacity:
            del self._until[next(iter(self._until))]
        self._until[key] = min(deadline, now + self._longest)

    def holds(self, key: bytes | None, now: float) -> bool:
        """Whether ``key`` (a request's cancel key; None: it has none) was cancelled and its deadline is ahead."""
        if key is None:
            return False
        until = self._until.get(key)
        return until is not None and until >= now
