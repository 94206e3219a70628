"""The model families embedfleet serves and the ``model_type`` values of each: the one list.

The engine's registry (services/gpu_worker/engine/models/registry.py) pairs each family here with its
PyTorch code; a model folder's reading (shared/model_dir/) takes from here what a folder of that type
means when its sentence-transformers files are silent. Pure data: no torch, so the tokenizer and the
gateway read it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FamilyTypes:
    name: str  # as the table of docs/models.md, `embedfleet check` and ModelSpec.family say it
    model_types: tuple[str, ...]  # config.json's model_type values the family serves
    # the pooling of a folder with no Pooling config; None: the last token for a decoder's config, else the mean
    pooling: str | None = None
    offset_positions: bool = False  # RoBERTa's scheme: position ids start after pad_token_id
    # position ids that come before a sequence's first token whatever the config says (MPNet: 2)
    fixed_offset: int = 0


BERT = FamilyTypes("BERT", ("bert",))
XLM_ROBERTA = FamilyTypes("XLM-RoBERTa", ("xlm-roberta", "roberta", "camembert"), offset_positions=True)
MPNET = FamilyTypes("MPNet", ("mpnet",), fixed_offset=2)  # its padding index is 1, fixed
MODERNBERT = FamilyTypes("ModernBERT", ("modernbert",))
# decoders: their embedding checkpoints are trained to pool the last token
QWEN3 = FamilyTypes("Qwen3", ("qwen3",), pooling="lasttoken")
QWEN2 = FamilyTypes("Qwen2", ("qwen2",), pooling="lasttoken")
MISTRAL = FamilyTypes("Mistral", ("mistral",), pooling="lasttoken")
LLAMA = FamilyTypes("Llama", ("llama",), pooling="lasttoken")
GTE = FamilyTypes("GTE", ("gte", "new"), pooling="cls")  # "new": the older NewModel checkpoints
NOMIC_BERT = FamilyTypes("NomicBERT", ("nomic_bert",))
# jina-embeddings-v3; its published config says xlm-roberta with rotary positions (the registry routes it)
JINA_V3 = FamilyTypes("JinaV3", ("jina_embeddings_v3",), pooling="mean")
GEMMA3 = FamilyTypes("Gemma3", ("gemma3_text",), pooling="mean")  # EmbeddingGemma pools the mean
GEMMA2 = FamilyTypes("Gemma2", ("gemma2",), pooling="lasttoken")  # bge-multilingual-gemma2 pools the last token
# a bidirectional Llama; its embedders (fine-tuned EuroBERTs) pool the mean
EUROBERT = FamilyTypes("EuroBERT", ("eurobert",), pooling="mean")
# jina-embeddings-v5-text-nano: EuroBERT with task adapters, pooled at the last token
JINA_V5 = FamilyTypes("JinaV5", ("jina_embeddings_v5",), pooling="lasttoken")
# two towers, text and images, into one space: the text tower pools its end-of-text token (the last)
CLIP = FamilyTypes("CLIP", ("clip",), pooling="lasttoken")
# the text tower pools the last position of rows padded to its 64 positions; ``siglip2``: SigLIP 2's NaFlex
# checkpoints, each image at its own grid of patches (its fixed-resolution ones are saved as ``siglip``)
SIGLIP = FamilyTypes("SigLIP", ("siglip", "siglip2"), pooling="lasttoken")
# a page model: a vision-language model (Qwen2-VL under ``vlm_config``) giving a vector per token of a query,
# or of a document page's image put inside a text prompt as image tokens; nothing pools
COLQWEN2 = FamilyTypes("ColQwen2", ("colqwen2",))
FAMILY_TYPES = (
    BERT,
    XLM_ROBERTA,
    MPNET,
    MODERNBERT,
    GTE,
    NOMIC_BERT,
    JINA_V3,
    QWEN3,
    QWEN2,
    MISTRAL,
    LLAMA,
    GEMMA3,
    GEMMA2,
    EUROBERT,
    JINA_V5,
    CLIP,
    SIGLIP,
    COLQWEN2,
)

# the families whose folders embed images beside texts
TWO_TOWERS = (CLIP, SIGLIP)
# the families whose images become tokens inside a text (their sizes nested in ``vlm_config``)
PAGE_MODELS = (COLQWEN2,)

# Qwen2VLTextConfig's and Qwen2VLVisionConfig's defaults (transformers): what a saved ColQwen2 config may
# leave out of its ``vlm_config``
QWEN2_VL_TEXT: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 80,
    "rope_theta": 1000000.0,
}
QWEN2_VL_VISION: dict[str, Any] = {
    "depth": 32,
    "embed_dim": 1280,
    "hidden_size": 3584,  # the merger's output: the language model's width
    "hidden_act": "quick_gelu",
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "rope_theta": 10000.0,
}
# Qwen2VLConfig's: the token an image's features replace
QWEN2_VL_IMAGE_TOKEN_ID = 151655

BY_TYPE = {t: f for f in FAMILY_TYPES for t in f.model_types}


def family_types(model_type: object) -> FamilyTypes | None:
    """The family serving ``model_type`` (config.json's), None for one no family serves."""
    return BY_TYPE.get(model_type) if isinstance(model_type, str) else None


def vlm_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A page model's language model config: ``vlm_config.text_config`` over the text keys ``vlm_config``
    keeps flat (configs saved before transformers nested them), over Qwen2VLTextConfig's defaults; its
    rope as ``rope_parameters`` (M-RoPE's "mrope" is the default rope over the positions it is given)."""
    vlm = config.get("vlm_config") or {}
    flat = {k: vlm[k] for k in (*QWEN2_VL_TEXT, "rope_scaling", "rope_parameters", "layer_types") if k in vlm}
    text = {**QWEN2_VL_TEXT, **flat, **(vlm.get("text_config") or {})}
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope.setdefault("rope_theta", float(text["rope_theta"]))
    kind = rope.get("rope_type") or rope.get("type") or "default"
    rope["rope_type"] = "default" if kind == "mrope" else kind
    rope.pop("type", None)
    text["rope_parameters"] = rope
    text.pop("rope_scaling", None)
    return text


def vlm_vision_config(config: dict[str, Any]) -> dict[str, Any]:
    """A page model's vision tower config, over Qwen2VLVisionConfig's defaults (``in_chans``: older configs'
    name of ``in_channels``; the rope base from ``rope_parameters`` where set)."""
    saved = (config.get("vlm_config") or {}).get("vision_config") or {}
    vision = {**QWEN2_VL_VISION, **saved}
    if "in_chans" in saved and "in_channels" not in saved:
        vision["in_channels"] = saved["in_chans"]
    vision["rope_theta"] = float((vision.get("rope_parameters") or {}).get("rope_theta", vision["rope_theta"]))
    return vision


def position_offset(config: dict[str, Any]) -> int:
    """How many position ids come before a sequence's first token: pad_token_id + 1 where positions
    start after the padding index (MPNet's fixed 2), else 0 (so that many fewer of max_position_embeddings
    are usable)."""
    family = family_types(config.get("model_type", "bert"))
    if family is None:
        return 0
    return int(config.get("pad_token_id", 1)) + 1 if family.offset_positions else family.fixed_offset
