"""Real text for tests and benchmarks, with no download: the Python documentation's help topics.

``pydoc_data.topics`` ships with CPython: ~80 documents of English prose mixed with code. Split
into paragraphs they give short, medium and long inputs; whole topics run far past 256 tokens.
"""

from __future__ import annotations

from pydoc_data.topics import topics


def _paragraphs() -> list[str]:
    out = []
    for name in sorted(topics):
        for para in topics[name].split("\n\n"):
            para = " ".join(para.split())
            if len(para) >= 20:
                out.append(para)
    return out


def mixed_texts(n: int = 240) -> list[str]:
    """``n`` texts of mixed length, in a fixed order: queries, passages, code, whole documents.

    About one in eight is a whole help topic, far longer than all-MiniLM-L6-v2's 256-token limit.
    """
    paras = _paragraphs()
    docs = [" ".join(topics[name].split()) for name in sorted(topics)]
    texts: list[str] = []
    i = 0
    while len(texts) < n:
        k = len(texts) % 8
        if k == 7:
            texts.append(docs[(i * 7) % len(docs)])
        elif k in (0, 3):
            # a short query: the first few words of a paragraph
            words = paras[(i * 13) % len(paras)].split()
            texts.append(" ".join(words[: 3 + i % 9]))
        else:
            texts.append(paras[(i * 31 + k) % len(paras)])
        i += 1
    return texts


def long_texts(n: int) -> list[str]:
    """Documents that reach the model's limit (bulk re-index shape)."""
    docs = [" ".join(topics[name].split()) for name in sorted(topics)]
    docs = [d for d in docs if len(d) > 2000]
    return [docs[i % len(docs)][(i // len(docs)) * 500 :] for i in range(n)]


def medium_texts(n: int) -> list[str]:
    """Passages of roughly 50 tokens."""
    paras = [p for p in _paragraphs() if 180 <= len(p) <= 320]
    return [paras[(i * 7) % len(paras)] for i in range(n)]
