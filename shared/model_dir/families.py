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
# the text tower pools the last position of rows padded to its 64 positions
SIGLIP = FamilyTypes("SigLIP", ("siglip",), pooling="lasttoken")
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
)

# the families whose folders embed images beside texts
TWO_TOWERS = (CLIP, SIGLIP)

BY_TYPE = {t: f for f in FAMILY_TYPES for t in f.model_types}


def family_types(model_type: object) -> FamilyTypes | None:
    """The family serving ``model_type`` (config.json's), None for one no family serves."""
    return BY_TYPE.get(model_type) if isinstance(model_type, str) else None


def position_offset(config: dict[str, Any]) -> int:
    """How many position ids come before a sequence's first token: pad_token_id + 1 where positions
    start after the padding index (MPNet's fixed 2), else 0 (so that many fewer of max_position_embeddings
    are usable)."""
    family = family_types(config.get("model_type", "bert"))
    if family is None:
        return 0
    return int(config.get("pad_token_id", 1)) + 1 if family.offset_positions else family.fixed_offset
