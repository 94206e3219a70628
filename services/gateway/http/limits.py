"""Per-API-key limits: requests and tokens per minute, each a token bucket refilled continuously.

A request is admitted while its key's request bucket holds one request and its token bucket is not
in debt; the tokens a request embedded are charged once it is answered (they are known only then),
so one large request may take the bucket below zero and the key waits until it refills. A refusal
says when to come back (``Retry-After``). Keys are named in metrics by an id, an HMAC under a secret
(services/gateway/metrics.py), never by the key itself.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Iterable

CHARS_PER_TOKEN = 4  # a job's tokens estimated from its characters, before it is tokenized (English text)
SPECIAL_TOKENS = 2  # added to each document (CLS and SEP, BOS and EOS)
NO_KEY = "none"  # the metrics' key label for requests that gave no key (no keys configured, open paths)
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("embedfleet_api_key", default=None)


def estimated_tokens(texts: Iterable[str]) -> int:
    """The tokens ``texts`` will make, estimated from their characters alone (no tokenizer at hand)."""
    return sum(-(-len(text) // CHARS_PER_TOKEN) + SPECIAL_TOKENS for text in texts)


def bind_key(key: str | None) -> None:
    """The API key of the request this task handles (the middleware sets it; routes charge it)."""
    _KEY.set(key)


def current_key() -> str | None:
    return _KEY.get()


class _Bucket:
    __slots__ = ("level", "at")

    def __init__(self, level: float, at: float) -> None:
        self.level, self.at = level, at


class KeyLimits:
    """``requests`` and ``tokens`` per minute per key; 0: that limit is off."""

    def __init__(self, requests: int = 0, tokens: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.requests, self.tokens = requests, tokens
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}  # (key, "requests" | "tokens") -> bucket

    @property
    def enabled(self) -> bool:
        return bool(self.requests or self.tokens)

    def _bucket(self, key: str, kind: str, per_minute: int, now: float) -> _Bucket:
        bucket = self._buckets.get((key, kind))
        if bucket is None:
            bucket = self._buckets[(key, kind)] = _Bucket(float(per_minute), now)
        else:  # refill for the time since it was last touched, up to a minute's worth
            bucket.level = min(float(per_minute), bucket.level + (now - bucket.at) * per_minute / 60.0)
            bucket.at = now
        return bucket

    def admit(self, key: str) -> tuple[str, int] | None:
        """None: admitted (one request taken from the key's bucket). Else (the limit, whole seconds to
        wait) — nothing is taken."""
        now = self._clock()
        tokens = self._bucket(key, "tokens", self.tokens, now) if self.tokens else None
        if tokens is not None and tokens.level < 0:
            return "tokens", math.ceil(-tokens.level * 60.0 / self.tokens)
        if self.requests:
            requests = self._bucket(key, "requests", self.requests, now)
            if requests.level < 1:
                return "requests", math.ceil((1 - requests.level) * 60.0 / self.requests)
            requests.level -= 1
        return None

    def reserve(self, key: str, tokens: int) -> int | None:
        """Take ``tokens`` (a job's estimate, at most a minute's worth) from the key's token bucket at
        once: None when taken, else the whole seconds until the bucket holds them (nothing taken)."""
        bucket = self._bucket(key, "tokens", self.tokens, self._clock())
        if bucket.level < tokens:
            return max(1, math.ceil((tokens - bucket.level) * 60.0 / self.tokens))
        bucket.level -= tokens
        return None

    def refund(self, key: str, tokens: int) -> None:
        """``tokens`` taken on an estimate and not spent, given back (up to a minute's worth)."""
        if self.tokens:
            bucket = self._bucket(key, "tokens", self.tokens, self._clock())
            bucket.level = min(float(self.tokens), bucket.level + tokens)

    def charge(self, key: str, tokens: int) -> None:
        """The tokens an admitted request of ``key`` embedded."""
        if self.tokens:
            self._bucket(key, "tokens", self.tokens, self._clock()).level -= tokens
