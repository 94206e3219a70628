"""Where a long text is cut before it is tokenized, and how much text is tokenized on the calling thread:
what both encoders (encoder.py, and fast_encoder.py's kitoken) follow, so neither needs the other. No NATS here."""

from __future__ import annotations

# text averages 3-6 characters a token: a window of 8 a token nearly always holds more tokens than
# are kept; when it does not, the whole text is tokenized (same result, only slower)
CHARS_PER_TOKEN = 8
# up to this many characters in all, a call's inputs are tokenized one by one on the calling thread:
# the library's batch call hands even one short query to its thread pool, whose threads then spin
# (sched_yield) waiting for more; for a few queries that spinning costs more CPU than the tokenizing
# (at 32 single queries in flight: the tokenizer process 0.57 -> 0.51 ms of CPU a query)
SERIAL_CHARS = 8192


def cut_chars(text: str, window: int, direction: str) -> str:
    """``text`` cut to about ``window`` characters at a whitespace, from the side truncation keeps;
    the text itself when it is short or has no whitespace to cut at."""
    if len(text) <= window:
        return text
    if direction == "right":
        at = text.find(" ", window)
        return text if at < 0 else text[:at]
    at = text.rfind(" ", 0, len(text) - window)
    return text if at < 0 else text[at:]  # the space kept: the first word tokenizes as in the whole text
