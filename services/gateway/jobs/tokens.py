"""A bulk job's tokens charged to its API key's ``--key-tokens-per-minute`` budget (http/limits.py), as an
online request's are.

A job's tokens are not known when it is submitted (the tokenizers count them later), so it is admitted
on an estimate from its characters (``estimated_tokens``): a job larger than a whole minute's budget is
refused (413: it would never fit; split it), one the key's bucket does not hold now is refused with 429
and ``Retry-After`` (the seconds until it does), and otherwise the estimate is taken from the bucket at
once. While the job runs, its state's token count (what the tokenizers counted of the rows stored) is
read every ``EVERY`` seconds: tokens past the estimate are charged as they are counted, and once the job
has ended, an estimate larger than the count is given back. The counted tokens go to the key's usage
(``counted``: the metrics' ``embedfleet_key_tokens_total``) whether or not the key is limited. Limits
are per gateway process: a gateway that stops meanwhile keeps what it charged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import CHARS_PER_TOKEN, KeyLimits, current_key, estimated_tokens
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.state import FINISHED

log = logging.getLogger("embedfleet.gateway.jobs")

EVERY = 2.0  # seconds between reads of a charged job's token count


class JobTokens:
    """The token budget of the keys whose jobs run (``limits``), and the jobs charged to them."""

    def __init__(
        self, kv, limits: KeyLimits, counted: Callable[[str, int], None] | None = None, every: float = EVERY
    ) -> None:
        self._kv, self._limits, self._every = kv, limits, every
        self._counted = counted or (lambda _key, _tokens: None)
        self._watching: set[asyncio.Task] = set()

    def admit(self, texts: Iterable[str]) -> tuple[str, int] | None:
        """The job of ``texts`` admitted for the request's key, its estimate taken: (the key, the tokens
        taken: 0 when the key has no limit), None without a key. ApiError (413, 429) when refused;
        nothing taken then."""
        key = current_key()
        if key is None:
            return None
        if not self._limits.tokens:
            return key, 0
        texts = list(texts)
        estimate = estimated_tokens(texts)
        per_minute = self._limits.tokens
        if estimate > per_minute:
            raise ApiError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"this job's {len(texts)} documents make some {estimate} tokens (one a {CHARS_PER_TOKEN} "
                f"characters), over this API key's limit of {per_minute} tokens a minute: submit them in "
                "smaller jobs",
                "documents",
            )
        wait = self._limits.reserve(key, estimate)
        if wait is not None:
            raise ApiError(
                ErrorCode.OVERLOADED,
                f"this job makes some {estimate} tokens; this API key's limit of {per_minute} tokens a minute "
                f"holds them in {wait}s: submit it then",
                "documents",
                retry_after=wait,
            )
        return key, estimate

    def cancel(self, taken: tuple[str, int] | None) -> None:
        """A job admitted and not submitted after all: its estimate given back."""
        if taken is not None:
            self._limits.refund(*taken)

    def watch(self, job: str, taken: tuple[str, int] | None) -> None:
        """Charge ``job`` its counted tokens as they come, beyond the estimate ``taken`` at its admission."""
        if taken is None:
            return
        task = asyncio.create_task(self._follow(job, *taken))
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)

    async def stop(self) -> None:
        for task in list(self._watching):
            task.cancel()
        await asyncio.gather(*self._watching, return_exceptions=True)

    async def _follow(self, job: str, key: str, charged: int) -> None:
        counted = 0
        while True:
            await asyncio.sleep(self._every)
            try:
                state = await read_state(self._kv, job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server away, or a record this code did not write: the next look
                log.debug("job %s: its tokens not read: %r", job, exc)
                continue
            if state is None:  # purged: what it counted is charged
                return
            if state.tokens > counted:
                self._counted(key, state.tokens - counted)
                counted = state.tokens
            if state.tokens > charged:
                self._limits.charge(key, state.tokens - charged)
                charged = state.tokens
            if state.status in FINISHED:
                if charged > state.tokens:
                    self._limits.refund(key, charged - state.tokens)
                return
