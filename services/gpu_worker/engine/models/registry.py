"""The one list of what the engine serves: ``model_type`` -> family. ``embedfleet check``, the
worker's start-up refusal and the README's table all come from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from shared.config import ConfigError
from services.gpu_worker.engine.models import bert, decoder, gemma3, modernbert, mpnet
from services.gpu_worker.engine.models.base import EncoderModel
from services.gpu_worker.engine.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    spec: Callable[[dict[str, Any]], ModelSpec]
    model: Callable[[ModelSpec], EncoderModel]
    examples: str
    pooling: str  # what its embedders usually pool (the folder's Pooling config decides)
    fp16_overflows: bool = False  # activations overflow float16: half precision means bfloat16 or float32


FAMILIES = (
    Family("BERT", ("bert",), bert.spec, bert.BertEncoder,
           "all-MiniLM-L6-v2, bge-*-en-v1.5, e5-*-v2, ms-marco-MiniLM cross-encoders", "mean / cls"),
    Family("XLM-RoBERTa", ("xlm-roberta", "roberta", "camembert"), bert.spec, bert.BertEncoder,
           "multilingual-e5-*, bge-m3 (dense), bge-reranker-v2-m3", "mean / cls"),
    Family("MPNet", ("mpnet",), mpnet.spec, mpnet.MPNetEncoder,
           "all-mpnet-base-v2, multi-qa-mpnet-base-dot-v1", "mean"),
    Family("ModernBERT", ("modernbert",), modernbert.spec, modernbert.ModernBertEncoder,
           "gte-modernbert-base, modernbert-embed-base, gte-reranker-modernbert-base", "mean / cls"),
    Family("Qwen3", ("qwen3",), decoder.spec, decoder.DecoderEncoder,
           "Qwen3-Embedding-0.6B/4B/8B", "lasttoken"),
    Family("Qwen2", ("qwen2",), decoder.spec, decoder.DecoderEncoder,
           "gte-Qwen2-1.5B-instruct, gte-Qwen2-7B-instruct", "lasttoken"),
    Family("Mistral", ("mistral",), decoder.spec, decoder.DecoderEncoder,
           "e5-mistral-7b-instruct, SFR-Embedding-Mistral", "lasttoken"),
    Family("Llama", ("llama",), decoder.spec, decoder.DecoderEncoder,
           "LLM2Vec-style and Llama-based embedders", "lasttoken"),
    Family("Gemma3", ("gemma3_text",), gemma3.spec, gemma3.Gemma3Encoder,
           "embeddinggemma-300m", "mean", fp16_overflows=True),
)

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
SUPPORTED_TYPES = tuple(_BY_TYPE)


def family_for(config: dict[str, Any]) -> Family:
    """The family serving this config.json; a ConfigError naming the model_type when none does."""
    model_type = config.get("model_type", "bert")
    family = _BY_TYPE.get(model_type)
    if family is None:
        hint = " (a multimodal Gemma3 checkpoint: serve its text model, model_type 'gemma3_text')" if model_type == "gemma3" else ""
        raise ConfigError(f"model_type {model_type!r} is not supported{hint} (supported: {', '.join(SUPPORTED_TYPES)})")
    return family


def build(spec: ModelSpec) -> EncoderModel:
    return family_for(spec.config or {"model_type": spec.model_type}).model(spec)
