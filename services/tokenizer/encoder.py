"""Text -> token IDs (with the model's prompts and truncation), and packing into chunks. No NATS here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer

from shared.config import ConfigError
from shared.errors import ErrorCode, ServiceError
from shared.model_dir import ModelInfo
from shared.protocol import EmbedOptions

Token = tuple[int, str, bool, int | None, int | None]  # id, text, special, start, stop (characters)


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int  # index of the first row in the request
    input_ids: np.ndarray  # [T] int32, sequences back to back
    cu_seqlens: np.ndarray  # [rows + 1] int32
    token_types: np.ndarray | None = None  # [T] int32 segment ids, for pairs


# text averages 3-6 characters a token: a window of 8 a token nearly always holds more tokens than
# are kept; when it does not, the whole text is tokenized (same result, only slower)
_CHARS_PER_TOKEN = 8


def _cut(text: str, window: int, direction: str) -> str:
    """``text`` cut to about ``window`` characters at a whitespace, from the side truncation keeps;
    the text itself when it is short or has no whitespace to cut at."""
    if len(text) <= window:
        return text
    if direction == "right":
        at = text.find(" ", window)
        return text if at < 0 else text[:at]
    at = text.rfind(" ", 0, len(text) - window)
    return text if at < 0 else text[at:]  # the space kept: the first word tokenizes as in the whole text


class TextEncoder:
    """The model's tokenizer with padding off and truncation at the model's real limit.

    tokenizer.json of many sentence-transformers models pads and truncates to a fixed length
    (all-MiniLM-L6-v2: 128) that is not the model's limit (256): both are replaced here.
    """

    def __init__(self, info: ModelInfo, prompts: dict[str, str] | None = None) -> None:
        self.max_length = info.max_seq_length
        self.vocab_size = info.vocab_size
        self.prompts = {**info.prompts, **(prompts or {})}  # configured prompts win over the folder's
        path = info.path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{info.path} has no tokenizer.json (a fast Hugging Face tokenizer is needed)")
        self._by_mode: dict[str, Tokenizer] = {}
        for mode in ("right", "left", "none"):
            tokenizer = Tokenizer.from_file(str(path))
            tokenizer.no_padding()
            if mode == "none":
                tokenizer.no_truncation()
            else:
                tokenizer.enable_truncation(max_length=self.max_length, direction=mode)
            self._by_mode[mode] = tokenizer

    def with_prompt(self, texts: list[str], options: EmbedOptions) -> list[str]:
        """Prefix the texts with the prompt the request names (as sentence-transformers does)."""
        if options.prompt_name is not None:
            if options.prompt_name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST, f"the model has no prompt {options.prompt_name!r} (its prompts: {known})"
                )
            prompt = self.prompts[options.prompt_name]
        else:
            prompt = self.prompts.get(options.input_type or "", "")
        return [prompt + t for t in texts] if prompt else texts

    def encode(self, texts: list[str], truncate: bool = True, direction: str = "right") -> list[list[int]]:
        """Token IDs per text, special tokens included. Releases the GIL while encoding.

        With truncation, a text far longer than the limit is first cut at a whitespace a generous
        number of characters past what the kept tokens can span (``_CHARS_PER_TOKEN`` per token),
        so a 50 KB document is not tokenized whole to keep 256 tokens. Words never span whitespace,
        so the kept tokens are those of the whole text; when the cut text does not even reach the
        limit (a text of very long tokens), the whole text is tokenized after all.
        """
        tokenizer = self._by_mode[direction if truncate else "none"]
        if not truncate:
            ids = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=True)]
            self._refuse_long(ids)
            return ids
        window = self.max_length * _CHARS_PER_TOKEN
        cut = [_cut(t, window, direction) for t in texts]
        encodings = tokenizer.encode_batch(cut, add_special_tokens=True)
        ids = []
        for text, short, e in zip(texts, cut, encodings):
            if short is not text and not e.overflowing:  # the cut text fit whole: the cut may matter
                e = tokenizer.encode(text, add_special_tokens=True)
            ids.append(e.ids)
        return ids

    def encode_pairs(
        self, pairs: list[tuple[str, str]], truncate: bool = True, direction: str = "right"
    ) -> tuple[list[list[int]], list[list[int]]]:
        """(query, document) pairs as one sequence each: [CLS] q [SEP] d [SEP], with segment ids.

        Truncation cuts the longer of the two first, as the reference tokenizers do.
        """
        tokenizer = self._by_mode[direction if truncate else "none"]
        encodings = tokenizer.encode_batch(list(pairs), add_special_tokens=True)
        ids = [e.ids for e in encodings]
        if not truncate:
            self._refuse_long(ids)
        return ids, [e.type_ids for e in encodings]

    def check_ids(self, token_ids: list[np.ndarray], truncate: bool = True, direction: str = "right") -> list[np.ndarray]:
        """Inputs given as token IDs: refused outside the vocabulary, cut (or refused) past the limit."""
        for i, ids in enumerate(token_ids):
            if len(ids) == 0:
                raise ServiceError(ErrorCode.INVALID_TOKENS, f"input {i} has no tokens")
            if ids.min() < 0 or ids.max() >= self.vocab_size:
                raise ServiceError(
                    ErrorCode.INVALID_TOKENS, f"input {i} has token ids outside the vocabulary [0, {self.vocab_size})"
                )
        if not truncate:
            self._refuse_long(token_ids)
            return token_ids
        n = self.max_length
        return [ids if len(ids) <= n else (ids[:n] if direction == "right" else ids[-n:]) for ids in token_ids]

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens with their character offsets (None for special tokens)."""
        out = []
        for text, enc in zip(texts, self._by_mode["right"].encode_batch(texts, add_special_tokens=add_special_tokens)):
            row = []
            for tid, token, special, (start, stop) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets):
                if special:
                    row.append((tid, token, True, None, None))
                else:
                    row.append((tid, text[start:stop], False, start, stop))
            out.append(row)
        return out

    def _refuse_long(self, ids) -> None:
        for i, seq in enumerate(ids):
            if len(seq) > self.max_length:
                raise ServiceError(
                    ErrorCode.INPUT_TOO_LONG,
                    f"input {i} has {len(seq)} tokens; the model's limit is {self.max_length} "
                    "(send truncate=true to cut it)",
                )


def pack_chunks(ids: list, max_tokens: int, max_seqs: int, token_types: list | None = None) -> Iterator[Chunk]:
    """Split sequences, in order, into chunks of at most ``max_tokens`` tokens and ``max_seqs`` rows.

    A single sequence longer than ``max_tokens`` still gets a chunk of its own. ``token_types``,
    when given, holds one segment-id list per sequence and is packed alongside.
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
        flat = np.concatenate([np.asarray(s, dtype=np.int32) for s in ids[start:end]])
        types = None
        if token_types is not None:
            types = np.concatenate([np.asarray(s, dtype=np.int32) for s in token_types[start:end]])
        yield Chunk(start=start, input_ids=flat, cu_seqlens=cu_seqlens, token_types=types)
        start = end
