"""Model folders through the engine as the services run them, for the family tests: a folder's config
edited in place, and its texts' vectors from the tokenizer and one packed engine batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.pooling import postprocess
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import EmbedOptions


def engine_vectors(
    folder: Path, texts: list[str], prompt_name: str | None = None, dimensions: int | None = None
) -> np.ndarray:
    """Normalised float32 vectors [N, dimensions or hidden]: every text in one packed batch (CPU, fp32)."""
    info = load_model_info(str(folder))
    encoder = TextEncoder(info)
    ids = encoder.encode(encoder.with_prompt(texts, EmbedOptions(prompt_name=prompt_name)))
    (chunk,) = pack_chunks(ids, 1 << 20, 1024)
    return postprocess(Engine(info, "cpu").embed(chunk.input_ids, chunk.cu_seqlens), True, dimensions, np.float32)


def edit_config(folder: Path, **changes) -> None:
    """Set the config.json keys given; a key given None is removed."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))
