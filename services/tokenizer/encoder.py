"""Text -> token IDs, and packing of token IDs into chunks for the workers. No NATS here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer

from shared.config import ConfigError
from shared.errors import ErrorCode, ServiceError
from shared.model_dir import ModelInfo


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int  # index of the first row in the request
    input_ids: np.ndarray  # [T] int32, sequences back to back
    cu_seqlens: np.ndarray  # [rows + 1] int32


class TextEncoder:
    """The model's tokenizer with padding off and truncation at the model's real limit.

    tokenizer.json of many sentence-transformers models pads and truncates to a fixed length
    (all-MiniLM-L6-v2: 128) that is not the model's limit (256): both are replaced here.
    """

    def __init__(self, info: ModelInfo) -> None:
        self.max_length = info.max_seq_length
        if not (info.path / "tokenizer.json").is_file():
            raise ConfigError(f"{info.path} has no tokenizer.json (a fast Hugging Face tokenizer is needed)")
        self._truncating = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length=self.max_length)
        self._full = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        self._full.no_padding()
        self._full.no_truncation()

    def encode(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        """Token IDs per text, special tokens included. Releases the GIL while encoding."""
        tokenizer = self._truncating if truncate else self._full
        ids = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=True)]
        if not truncate:
            for i, seq in enumerate(ids):
                if len(seq) > self.max_length:
                    raise ServiceError(
                        ErrorCode.INPUT_TOO_LONG,
                        f"input {i} has {len(seq)} tokens; the model's limit is {self.max_length} "
                        "(send truncate=true to cut it)",
                    )
        return ids


def pack_chunks(ids: list[list[int]], max_tokens: int, max_seqs: int) -> Iterator[Chunk]:
    """Split sequences, in order, into chunks of at most ``max_tokens`` tokens and ``max_seqs`` rows.

    A single sequence longer than ``max_tokens`` still gets a chunk of its own.
    """
    start = 0
    while start < len(ids):
        end, tokens = start, 0
        while end < len(ids) and end - start < max_seqs:
            n = len(ids[end])
            if end > start and tokens + n > max_tokens:
                break
            tokens += n
            end += 1
        lengths = np.fromiter((len(s) for s in ids[start:end]), dtype=np.int32, count=end - start)
        cu_seqlens = np.zeros(end - start + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_seqlens[1:])
        flat = np.fromiter(
            (t for s in ids[start:end] for t in s), dtype=np.int32, count=int(cu_seqlens[-1])
        )
        yield Chunk(start=start, input_ids=flat, cu_seqlens=cu_seqlens)
        start = end
