"""sentence-transformers' vectors, each text encoded once a test run: many modules compare the stack with
the reference on the same texts (the corpus's first documents, the same queries), and encoding them is
a large share of the suite's CPU.

``CachedReference`` wraps a ``SentenceTransformer``: ``encode`` looks each text up (with the options
that change its vector: normalisation, prompt) in a SQLite file that every pytest process of the run
shares, encodes only the texts missing there, and keeps them. Everything else is the model's own
(``tokenizer``, ``max_seq_length``, ``encode`` with any other option, uncached).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# options that change no vector (how the work is batched and returned as numpy)
_NEUTRAL = {"batch_size", "convert_to_numpy", "show_progress_bar"}
# options that change the vectors: part of each text's key
_KEYED = {"normalize_embeddings", "prompt", "prompt_name"}


class CachedReference:
    """A SentenceTransformer whose ``encode`` of texts reuses the vectors the run already computed."""

    def __init__(self, model: Any, model_id: str, path: Path) -> None:
        self._model = model
        self._model_id = model_id  # the folder: one file may serve several models
        self._db = sqlite3.connect(path, timeout=60, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __getitem__(self, index: int) -> Any:  # the model's modules, as on the SentenceTransformer
        return self._model[index]

    def encode(self, sentences: str | Sequence[str], **options: Any) -> np.ndarray:
        if set(options) - _NEUTRAL - _KEYED or options.get("convert_to_numpy", True) is not True:
            return self._model.encode(sentences, **options)
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not texts:
            return self._model.encode(sentences, **options)
        keyed = {k: options[k] for k in sorted(_KEYED & set(options))}
        keys = [self._key(text, keyed) for text in texts]
        found = self._lookup(set(keys))
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            where = {k: i for i, k in reversed(list(enumerate(keys)))}
            fresh = self._model.encode([texts[where[k]] for k in missing], **options)
            fresh = np.asarray(fresh, np.float32)
            self._db.executemany(
                "INSERT OR IGNORE INTO vectors VALUES (?, ?)", [(k, v.tobytes()) for k, v in zip(missing, fresh)]
            )
            found.update(zip(missing, fresh))
        out = np.stack([found[k] for k in keys])
        return out[0] if single else out

    def _key(self, text: str, keyed: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps([self._model_id, text, keyed]).encode()).hexdigest()

    def _lookup(self, keys: set[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        wanted = list(keys)
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            rows = self._db.execute(
                f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(part))})", part
            ).fetchall()
            found.update((k, np.frombuffer(v, np.float32)) for k, v in rows)
        return found
