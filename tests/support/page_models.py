"""Tiny page-model folders (ColQwen2) for the tests: bench/page_models.py's "tiny" shape, the weights redrawn as
the other family tests' are (tiny_models._randomize: large enough to tell tokens and models apart), and
transformers' reference for them (``ColQwen2ForRetrieval`` and ``ColQwen2Processor`` loaded from the folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.page_models import make_colqwen2
from tests.support.tiny_models import _randomize

# the vision tower's q, k and v weights drawn this much wider than _randomize's: its attention then depends
# on the patches' rotary positions (at N(0, 0.1), over noise images, it is near uniform: positions hardly count)
VISION_QKV_SCALE = 3.0


def build_colqwen2(root: Path, *, hub_names: bool = True) -> Path:
    """``root/colqwen2``: images of 4 to 64 tokens (16 to 256 patches), text 64 wide, vectors 128 wide."""
    return make_colqwen2(root, "tiny", init=_init, hub_names=hub_names)


def _init(model: torch.nn.Module) -> None:
    _randomize(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".visual." in f".{name}" and ".attn.qkv." in name:
                param.mul_(VISION_QKV_SCALE)


def reference(folder: Path) -> tuple[Any, Any]:
    """transformers' (ColQwen2ForRetrieval in eval mode, ColQwen2Processor) for ``folder``."""
    from transformers import ColQwen2ForRetrieval, ColQwen2Processor

    return ColQwen2ForRetrieval.from_pretrained(str(folder)).eval(), ColQwen2Processor.from_pretrained(str(folder))


def reference_vectors(model: Any, inputs: Any) -> np.ndarray:
    """transformers' token vectors [L, dim] float32 of one processed query or page (a batch of one: no padding)."""
    with torch.inference_mode():
        return model(**inputs).embeddings[0].float().numpy()
