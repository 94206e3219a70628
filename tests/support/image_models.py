"""Tiny random-weight two-tower folders (CLIP) as transformers saves them, for the image tests: the
model, its image processor's preprocessor_config.json, and the default model's WordPiece tokenizer
with CLIP's end-of-text token at the end of every text (its [SEP])."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from tests.support.tiny_models import _randomize, _wordpiece

# CLIP's text tower pools its end-of-text token: the WordPiece vocabulary's [SEP] plays that part
CLS, SEP = 101, 102
TEXT = dict(
    vocab_size=30522,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=77,
    bos_token_id=CLS,
    eos_token_id=SEP,
    pad_token_id=0,
)
# 32-pixel images in 8-pixel patches: 16 patches and the class token
VISION = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)
PROJECTION = 24


def build_clip(root: Path, *, shortest_edge: int = 32) -> Path:
    """``root/clip``: a CLIPModel folder whose images are resized (shortest edge ``shortest_edge``,
    bicubic) and center-cropped to 32 pixels."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    folder = Path(root) / "clip"
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=PROJECTION))
    _randomize(model)
    model.save_pretrained(folder, safe_serialization=True)
    size = VISION["image_size"]
    CLIPImageProcessor(
        size={"shortest_edge": shortest_edge}, crop_size={"height": size, "width": size}
    ).save_pretrained(folder)
    tokenizer = Tokenizer.from_str(_wordpiece())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": TEXT["max_position_embeddings"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


# SigLIP's tower sizes: a text and an image vector of the same width (48), 64 text positions
SIGLIP_TEXT = dict(
    vocab_size=30522,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
)
SIGLIP_VISION = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)


def build_siglip(root: Path) -> Path:
    """``root/siglip``: a SiglipModel folder (32-pixel images resized bicubic, 16 patches, no class token),
    its texts ending in [SEP] and padded with [PAD] to 64 tokens as SigLIP's processor pads them."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    folder = Path(root) / "siglip"
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = SiglipModel(SiglipConfig(text_config=SIGLIP_TEXT, vision_config=SIGLIP_VISION))
    _randomize(model)
    model.save_pretrained(folder, safe_serialization=True)
    size = SIGLIP_VISION["image_size"]
    SiglipImageProcessor(size={"height": size, "width": size}).save_pretrained(folder)
    tokenizer = Tokenizer.from_str(_wordpiece())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.post_processor = TemplateProcessing(
        single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1", special_tokens=[("[SEP]", SEP)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": SIGLIP_TEXT["max_position_embeddings"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
