"""The Accept header: which of the media types an answer can take the client asked for (RFC 9110,
"Accept"), or none.

Each range's weight is its ``q`` (1 when not given; ``q=0``: not acceptable); a media type takes the
weight of the most specific range that names it (``application/json``, then ``application/*``, then
``*/*``). The type of the highest weight is answered; ties go to the more specific range, then to
the range given first, then to the order the route offers its types in (its default first). A
missing or empty header is ``*/*``: the route's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Offer:
    """A media type an answer can take, and the answer it names (aliases share one ``kind``)."""

    media: str
    kind: str


def chosen(accept: str | None, offers: Sequence[Offer]) -> Offer | None:
    """The offer ``accept`` asks for, or None when it takes none of them."""
    ranges = _ranges(accept or "*/*")
    best: tuple | None = None
    for order, offer in enumerate(offers):
        kind, _, sub = offer.media.partition("/")
        # the most specific range naming the offer: (specificity, -position, weight)
        named = [
            (2 if r_sub == sub else 1 if r_kind == kind else 0, -position, q)
            for position, (r_kind, r_sub, q) in enumerate(ranges)
            if (r_kind, r_sub) in ((kind, sub), (kind, "*"), ("*", "*"))
        ]
        if not named:
            continue
        specificity, position, q = max(named, key=lambda n: n[:2])
        rank = (q, specificity, position, -order)
        if q > 0 and (best is None or rank > best[0]):
            best = (rank, offer)
    return None if best is None else best[1]


def named(offers: Sequence[Offer]) -> str:
    """The media types of ``offers`` as a sentence names them, an alias left out: "a, b or c"."""
    first: dict[str, str] = {}
    for offer in offers:
        first.setdefault(offer.kind, offer.media)
    media = list(first.values())
    return media[0] if len(media) == 1 else f"{', '.join(media[:-1])} or {media[-1]}"


def _ranges(accept: str) -> list[tuple[str, str, float]]:
    """(type, subtype, weight) of each media range of an Accept header, in lower case (``*`` alone: ``*/*``;
    a weight that is no number: 0, as a range the client cannot have meant)."""
    out = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media:
            continue
        kind, _, sub = ("*/*" if media == "*" else media).lower().partition("/")
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        out.append((kind.strip(), sub.strip(), q))
    return out or [("*", "*", 1.0)]  # only commas and spaces: as if not given
