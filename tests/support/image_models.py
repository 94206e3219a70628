"""Tiny two-tower folders (CLIP, SigLIP) for the image tests: bench/two_towers.py's "tiny" shapes, the
weights redrawn as the other family tests' are (tiny_models._randomize: large enough to tell models apart)."""

from __future__ import annotations

from pathlib import Path

from bench.two_towers import SHAPES, make_two_tower, text_config
from tests.support.tiny_models import _randomize

PROJECTION = SHAPES["clip"]["tiny"][2]["projection_dim"]  # CLIP's vectors: 24 wide
SIGLIP_TEXT = text_config("siglip", "tiny")  # SigLIP's text tower: 48 wide, 64 positions


def build_clip(root: Path, *, shortest_edge: int = 32) -> Path:
    """``root/clip``: 32-pixel images resized (shortest edge ``shortest_edge``, bicubic) and center-cropped,
    16 patches and the class token; texts ``[CLS] text [SEP]``, pooled at [SEP]."""
    return make_two_tower("clip", root, "tiny", init=_randomize, shortest_edge=shortest_edge)


def build_siglip(root: Path) -> Path:
    """``root/siglip``: 32-pixel images resized bicubic, 16 patches, no class token; texts ``text [SEP]``
    padded with [PAD] to 64 tokens as SigLIP's processor pads them."""
    return make_two_tower("siglip", root, "tiny", init=_randomize)


def build_siglip2(root: Path) -> Path:
    """``root/siglip2``: SigLIP 2 NaFlex, each image resized to at most 24 patches of 8 pixels at its own
    aspect, 4 x 4 learnt positions resized to its grid; SigLIP's text tower."""
    return make_two_tower("siglip2", root, "tiny", init=_randomize)


def package_clip(folder: Path, root: Path, layout: str) -> Path:
    """``folder`` (``build_clip``'s) in the sentence-transformers packaging, ``root/<layout>``:

    - "published": as sentence-transformers/clip-ViT-B-32 is laid out (sentence-transformers 2): modules.json
      names one CLIPModel module, whose folder ``0_CLIPModel`` holds the transformers folder; no config.json
      at the root;
    - "saved": as this environment's sentence-transformers saves it (``SentenceTransformer(modules=
      [CLIPModel(folder)]).save``): config.json at the root, the image processor in processor_config.json.

    The tokenizer pads with [PAD], as the published CLIP's pads with its own token: sentence-transformers pads
    a batch (the served model never pads)."""
    import json
    import shutil

    out = root / layout
    inner = out / "0_CLIPModel" if layout == "published" else root / f"{layout}-source"
    shutil.copytree(folder, inner)
    config = json.loads((inner / "tokenizer_config.json").read_text())
    (inner / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "[PAD]"}, indent=2) + "\n")
    if layout == "published":
        module = {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}
        (out / "modules.json").write_text(json.dumps([module], indent=2) + "\n")
        versions = {"sentence_transformers": "2.0.0", "transformers": "4.7.0", "pytorch": "1.9.0"}
        (out / "config_sentence_transformers.json").write_text(json.dumps({"__version__": versions}) + "\n")
    elif layout == "saved":
        from sentence_transformers import SentenceTransformer, models

        SentenceTransformer(modules=[models.CLIPModel(str(inner))], device="cpu").save(str(out))
    else:
        raise ValueError(f"no packaging {layout!r} (published, saved)")
    return out
