"""The reference for late chunking (test-only): transformers' AutoModel on the model's folder, each
chunk's vector the mean of the last hidden states of the window it is pooled in ([CLS] window [SEP],
the window as shared/chunk_windows.py places it) over the chunk's token positions, L2-normalised."""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.shared.chunk_windows import late_windows
from embedfleet.shared.text_chunks import TextChunk


class Reference:
    """transformers' AutoModel and tokenizer on the model's folder."""

    def __init__(self, path) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()
        # each document's late vectors, by its chunks and room: tests that chunk the same corpus the same
        # way (a job as a command, then over HTTP) ask again
        self._late: dict[tuple[str, tuple[tuple[int, int], ...], int], np.ndarray] = {}

    def offsets(self, text: str) -> np.ndarray:
        """[tokens, 2] each content token's characters."""
        return np.array(
            self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"],
            dtype=np.int64,
        ).reshape(-1, 2)

    def tokens(self, text: str, start: int, end: int, offsets: np.ndarray | None = None) -> tuple[int, int]:
        """The content tokens [first, last) of ``text`` (its ``offsets``, when known) in its characters [start, end)."""
        offsets = self.offsets(text) if offsets is None else offsets
        inside = np.flatnonzero((offsets[:, 0] >= start) & (offsets[:, 1] <= end))
        assert len(inside) and np.all(np.diff(inside) == 1), (start, end)
        return int(inside[0]), int(inside[-1]) + 1

    def chunk_vectors(self, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
        """[spans, dim]: the mean of the last hidden states of ``text`` ([CLS] text [SEP], not cut) over each
        span of content tokens, L2-normalised."""
        batch = self.tokenizer(text, return_tensors="pt")
        assert batch["input_ids"].shape[1] <= 256, "the reference reads the whole text at once (MiniLM's limit)"
        with torch.inference_mode():
            states = self.model(**batch).last_hidden_state[0]
        means = np.stack([states[1 + a : 1 + b].mean(0).numpy() for a, b in spans])  # [CLS] first
        return means / np.linalg.norm(means, axis=1, keepdims=True)

    def late_vectors(self, text: str, rows: list[tuple[int, int]], room: int) -> np.ndarray:
        """[chunks, dim]: the late vectors of ``text``'s chunks, given as their characters (start, end), in
        order: grouped into windows of ``room`` content tokens, each chunk pooled in the window that owns it."""
        key = (text, tuple((int(s), int(e)) for s, e in rows), room)
        if key not in self._late:
            self._late[key] = self._late_vectors(text, rows, room)
        return self._late[key]

    def _late_vectors(self, text: str, rows: list[tuple[int, int]], room: int) -> np.ndarray:
        offsets = self.offsets(text)
        if not len(offsets):  # a text without tokens: one chunk, its whole sequence pooled
            with torch.inference_mode():
                states = self.model(**self.tokenizer(text, return_tensors="pt")).last_hidden_state[0]
            mean = states.mean(0).numpy()[None]
            return mean / np.linalg.norm(mean)
        chunks = [TextChunk(s, e, *self.tokens(text, s, e, offsets)) for s, e in rows]
        out = []
        for w in late_windows(chunks, room):
            start, end = chunks[w.first].start, chunks[w.end - 1].end
            window = text[start:end]
            within = self.offsets(window)
            out.append(
                self.chunk_vectors(
                    window, [self.tokens(window, c.start - start, c.end - start, within) for c in chunks[w.own : w.end]]
                )
            )
        return np.concatenate(out)
