"""Random-weight page-model folders (ColQwen2) as published for transformers' ``ColQwen2ForRetrieval``, at
the published model's sizes or tiny: config.json with Qwen2-VL under ``vlm_config`` (its text and vision
configs nested), the weights under the published names (``vlm.model.language_model.*``,
``vlm.model.visual.*``, ``embedding_proj_layer.*``), Qwen2-VL's image processor's ``preprocessor_config.json``
and a byte-level BPE tokenizer (tests/support/tiny_models.py's, 8192 tokens) with Qwen2-VL's special tokens
added, so that ``ColQwen2Processor.from_pretrained(folder)`` and ``ColQwen2ForRetrieval.from_pretrained(folder)``
both load it.

    from bench.page_models import make_colqwen2
    make_colqwen2(root, "tiny")  # the tests' sizes: a few hundred patches an image at most
    make_colqwen2(root, "base")  # vidore/colqwen2-v1.0-hf's (Qwen2-VL-2B), vocabulary cut: GPU checks
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Qwen2-VL's special tokens past the BPE's own ("[PAD]" 0, "<|endoftext|>" 1: the pad token), in id order
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
BPE_VOCAB = 8192  # tiny_models._byte_level_bpe's trained vocabulary
VOCAB = BPE_VOCAB + len(SPECIALS)
ENDOFTEXT = 1
IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (BPE_VOCAB + SPECIALS.index(t) for t in SPECIALS[1:])
EMBEDDING_DIM = 128  # vidore/colqwen2-v1.0-hf's vectors

_OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]  # Qwen2VLImageProcessor's mean and std
_OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
PIXELS_PER_TOKEN = 28 * 28  # (patch_size * merge_size)² pixels: one image token


def _rope(mrope_section: list[int]) -> dict[str, Any]:
    """Qwen2-VL's rope: M-RoPE's sections (temporal, height, width) of a head's frequencies, half its size."""
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope_section}


# Qwen2-VL-2B, as vidore/colqwen2-v1.0-hf (its processor: at most 768 image tokens a page)
_PUBLISHED_TEXT = dict(
    hidden_size=1536,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    intermediate_size=8960,
    rope_parameters=_rope([16, 24, 24]),
    max_position_embeddings=32768,
)
_PUBLISHED_VISION = dict(embed_dim=1280, depth=32, num_heads=16, hidden_size=1536)
_TINY_TEXT = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    rope_parameters=_rope([2, 3, 3]),
    max_position_embeddings=512,  # a page of 64 image tokens and its prompt, a query: the tests' budgets
)
_TINY_VISION = dict(embed_dim=32, depth=2, num_heads=4, hidden_size=64)
_PUBLISHED_PIXELS = (4 * PIXELS_PER_TOKEN, 768 * PIXELS_PER_TOKEN)

# shape -> (text_config, vision_config, (min_pixels, max_pixels))
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[int, int]]] = {
    "base": (_PUBLISHED_TEXT, _PUBLISHED_VISION, _PUBLISHED_PIXELS),
    # the published widths, 4 of its 28 language layers and 8 of its 32 vision blocks: every kernel at its real
    # shape, a sixth of the weights (bench/gpu_check builds and checks it within its minutes)
    "mid": ({**_PUBLISHED_TEXT, "num_hidden_layers": 4}, {**_PUBLISHED_VISION, "depth": 8}, _PUBLISHED_PIXELS),
    # tiny's widths with the published processor's bounds (4 to 768 image tokens a page): bench.images times the
    # preparation of real page sizes, and the engine's per-page work apart from its GEMMs
    "pages": ({**_TINY_TEXT, "max_position_embeddings": 1024}, _TINY_VISION, _PUBLISHED_PIXELS),
    # at most 64 image tokens (256 patches) an image
    "tiny": (_TINY_TEXT, _TINY_VISION, (4 * PIXELS_PER_TOKEN, 64 * PIXELS_PER_TOKEN)),
}
# every shape's: Qwen2-VL-2B's norms and limits; the BPE's special tokens
_TEXT_FIXED = dict(
    vocab_size=VOCAB,
    rms_norm_eps=1e-6,
    bos_token_id=ENDOFTEXT,
    eos_token_id=IM_END,
)


def make_colqwen2(
    root: Path,
    shape: str = "tiny",
    init: Callable[[torch.nn.Module], None] | None = None,
    *,
    hub_names: bool = True,
    tokenizer: bool = True,
) -> Path:
    """Write ``root/colqwen2`` and return it. ``init`` redraws the weights (transformers' own init otherwise);
    ``hub_names``: the published tensor names (``vlm.model.…``; False: as transformers 5 saves them, ``vlm.…``,
    both of which transformers and the engine load); ``tokenizer``: the tokenizer trained as the tests' (its BPE learns the default model's words;
    False: a plain word-level one with the same ids, for bench/gpu_check's machine, which has no model package)."""
    import transformers

    if shape not in SHAPES:
        raise ValueError(f"no ColQwen2 shape {shape!r} (have: {', '.join(SHAPES)})")
    text, vision, (min_pixels, max_pixels) = SHAPES[shape]
    folder = Path(root) / "colqwen2"
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    vlm = transformers.Qwen2VLConfig(
        text_config={**text, **_TEXT_FIXED},
        vision_config=vision,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    model = transformers.ColQwen2ForRetrieval(transformers.ColQwen2Config(vlm_config=vlm, embedding_dim=EMBEDDING_DIM))
    if init is not None:
        init(model)
    model.save_pretrained(folder)
    if hub_names:
        _publish_names(folder / "model.safetensors")
    # Qwen2VLImageProcessor's options as its saved config holds them (both spellings of the pixel bounds)
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "ColQwen2Processor",
        "do_convert_rgb": True,
        "do_resize": True,
        "resample": 3,  # bicubic
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _OPENAI_CLIP_MEAN,
        "image_std": _OPENAI_CLIP_STD,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    _write_tokenizer(folder, trained=tokenizer)
    return folder


def _publish_names(path: Path) -> None:
    """Rename transformers 5's ``vlm.X`` tensors to the published ``vlm.model.X`` (transformers reads both)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    renamed = {(f"vlm.model.{k[4:]}" if k.startswith("vlm.") else k): v for k, v in tensors.items()}
    save_file(renamed, str(path), metadata={"format": "pt"})


def _write_tokenizer(folder: Path, trained: bool = True) -> None:
    """tokenizer.json: the tiny models' byte-level BPE with Qwen2-VL's special tokens added (no template: Qwen2's
    tokenizer adds no tokens); tokenizer_config.json as Qwen2-VL's, its pad token "<|endoftext|>" (a query's
    augmentation tokens). Not ``trained``: a word-level vocabulary of the same size and special tokens' ids
    instead (enough for the engine, which reads only ids; the BPE is trained on a model package's words)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    if trained:
        from tests.support.tiny_models import _byte_level_bpe

        bpe = Tokenizer.from_str(_byte_level_bpe())
    else:
        words = {"[PAD]": 0, "<|endoftext|>": ENDOFTEXT} | {f"w{i}": i for i in range(2, BPE_VOCAB)}
        bpe = Tokenizer(models.WordLevel(words, unk_token="[PAD]"))
        bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if bpe.get_vocab_size() != VOCAB or bpe.token_to_id("<|image_pad|>") != IMAGE_PAD:
        raise AssertionError("the byte-level BPE's vocabulary changed: update page_models.BPE_VOCAB")
    bpe.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "padding_side": "right",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
