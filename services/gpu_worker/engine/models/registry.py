"""The one list of what the engine serves: ``model_type`` -> family. ``embedfleet check``, the
worker's start-up refusal and the table of docs/models.md all come from here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from embedfleet.services.gpu_worker.engine.models import (
    bert,
    clip,
    colqwen2,
    decoder,
    eurobert,
    gemma2,
    gemma3,
    gte,
    jina_v3,
    jina_v5,
    modernbert,
    mpnet,
    nomic_bert,
    siglip,
)
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.spec import ACTIVATIONS, ModelSpec
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir import families as model_families
from embedfleet.shared.model_dir.info import ModelInfo


@dataclass(frozen=True, slots=True)
class Family:
    types: model_families.FamilyTypes  # its name and model_types (the table shared code reads too)
    spec: Callable[[dict[str, Any]], ModelSpec]
    model: Callable[[ModelSpec], EncoderModel]
    examples: str
    pooling: str  # what its embedders usually pool (the folder's Pooling config decides)
    attention: str  # how its layers attend
    cuda: str  # the CUDA attention path (see attention.select_attention)
    prompts: str = "—"  # what its well-known checkpoints ship in config_sentence_transformers.json
    verified: str = "states, stack"  # what the suite checks (see _VERIFIED)
    fp16_overflows: bool = False  # activations overflow float16: half precision means bfloat16 or float32
    llm_reranker: bool = False  # its causal LMs serve as rerankers from their answer tokens' logits (LogitScore)

    @property
    def name(self) -> str:
        return self.types.name

    @property
    def model_types(self) -> tuple[str, ...]:
        return self.types.model_types


_FLASH = "FlashInfer (head size 64/128/256) or PyTorch flash varlen; CUDA graphs"
# symmetric windows: no FlashInfer kernel takes them; PyTorch's varlen kernel does where it has window_size
_WINDOWED = (
    "PyTorch flash varlen with a symmetric window; CUDA graphs (SDPA where this PyTorch's kernel has no windows)"
)
FAMILIES = (
    Family(
        model_families.BERT,
        bert.spec,
        bert.BertEncoder,
        "all-MiniLM-L6-v2, bge-*-en-v1.5, e5-*-v2, ms-marco-MiniLM cross-encoders",
        "mean / cls",
        "bidirectional",
        _FLASH,
        verified="real, states, logits, rerank",
    ),
    Family(
        model_families.XLM_ROBERTA,
        bert.spec,
        bert.BertEncoder,
        "multilingual-e5-*, bge-m3 (dense), bge-reranker-v2-m3",
        "mean / cls",
        "bidirectional",
        _FLASH,
        prompts="e5: `query: ` / `passage: `",
        verified="states",
    ),
    Family(
        model_families.MPNET,
        mpnet.spec,
        mpnet.MPNetEncoder,
        "all-mpnet-base-v2, multi-qa-mpnet-base-dot-v1",
        "mean",
        "bidirectional + relative-position bias",
        "SDPA (a score bias: no flash kernel takes it); no CUDA graphs",
        verified="states, stack, logits",
    ),
    Family(
        model_families.MODERNBERT,
        modernbert.spec,
        modernbert.ModernBertEncoder,
        "gte-modernbert-base, modernbert-embed-base, gte-reranker-modernbert-base",
        "mean / cls",
        "bidirectional; local layers a ±64-token window",
        _WINDOWED,
        prompts="modernbert-embed: `search_query: ` / `search_document: `",
        verified="states, stack, logits, rerank",
    ),
    Family(
        model_families.GTE,
        gte.spec,
        gte.GteEncoder,
        "gte-multilingual-base, gte-base-en-v1.5, gte-large-en-v1.5, snowflake-arctic-embed-m-v2.0",
        "cls",
        "bidirectional; fixed NTK rope scaling where set",
        _FLASH,
        prompts="arctic-embed-m-v2.0: `query: `",
        verified="stack, folder",
    ),
    Family(
        model_families.NOMIC_BERT,
        nomic_bert.spec,
        nomic_bert.NomicBertEncoder,
        "nomic-embed-text-v1, nomic-embed-text-v1.5, snowflake-arctic-embed-m-long, nomic-embed-text-v2-moe",
        "mean / cls",
        "bidirectional; rotary pairs interleaved where set; v2-moe: a mixture of experts (top 2 of 8) "
        "in place of every other layer's MLP",
        _FLASH + " (v2-moe: eager batches run each expert over its tokens; captured graphs every expert "
        "over every token, as their shapes must not depend on the routing)",
        prompts="nomic-embed: `search_query: ` / `search_document: `",
        verified="stack, folder, moe",
    ),
    Family(
        model_families.JINA_V3,
        jina_v3.spec,
        jina_v3.JinaV3Encoder,
        "jina-embeddings-v3 (as published: `xlm-roberta` with rotary positions), its task adapters chosen per "
        "request (`task`), rows of different tasks in one batch",
        "mean",
        "bidirectional",
        _FLASH,
        prompts="task names: `retrieval.query`: `Represent the query for retrieving evidence documents: `, "
        "`retrieval.passage`: `Represent the document for retrieval: `, `separation`, `classification`, "
        "`text-matching`: none",
        verified="folder, adapters",
    ),
    Family(
        model_families.QWEN3,
        decoder.spec,
        decoder.DecoderEncoder,
        "Qwen3-Embedding-0.6B/4B/8B, Qwen3-Reranker-0.6B/4B/8B (the causal LM's yes/no logits, or sequence "
        "classification)",
        "lasttoken",
        "causal (or bidirectional by config), grouped-query",
        _FLASH,
        prompts="`Instruct: {task}\\nQuery:` for queries",
        verified="states, stack, logits, rerank, llm-rerank",
        llm_reranker=True,
    ),
    Family(
        model_families.QWEN2,
        decoder.spec,
        decoder.DecoderEncoder,
        "gte-Qwen2-1.5B-instruct, gte-Qwen2-7B-instruct",
        "lasttoken",
        "causal (or bidirectional by config), grouped-query",
        _FLASH,
        prompts="`Instruct: {task}\\nQuery: `",
        verified="states, stack, llm",
        llm_reranker=True,
    ),
    Family(
        model_families.MISTRAL,
        decoder.spec,
        decoder.DecoderEncoder,
        "e5-mistral-7b-instruct, SFR-Embedding-Mistral",
        "lasttoken",
        "causal, grouped-query, sliding window where set",
        _FLASH,
        prompts="`Instruct: {task}\\nQuery: `",
        verified="states, stack, llm",
        llm_reranker=True,
    ),
    Family(
        model_families.LLAMA,
        decoder.spec,
        decoder.DecoderEncoder,
        "Llama-based embedders (LLM2Vec-style, bidirectional by config)",
        "lasttoken / mean (bidirectional embedders)",
        "causal (or bidirectional by config), grouped-query; llama3 / linear rope scaling",
        _FLASH,
        verified="states, stack, logits, llm, folder",
        llm_reranker=True,
    ),
    Family(
        model_families.GEMMA3,
        gemma3.spec,
        gemma3.Gemma3Encoder,
        "embeddinggemma-300m",
        "mean, then Dense 768→3072→768",
        "bidirectional; local layers a ±256-token window",
        _WINDOWED,
        prompts="`task: search result \\| query: ` / `title: none \\| text: `",
        fp16_overflows=True,
        verified="states, stack",
    ),
    Family(
        model_families.GEMMA2,
        gemma2.spec,
        gemma2.Gemma2Encoder,
        "bge-multilingual-gemma2",
        "lasttoken",
        "causal, grouped-query, scores soft-capped (tanh); alternate layers a 4096-token window",
        "SDPA with the scores capped explicitly (no flash kernel caps them); no CUDA graphs",
        prompts="`<instruct>{task}\\n<query>` for queries",
        fp16_overflows=True,
        verified="states, stack, folder",
    ),
    Family(
        model_families.EUROBERT,
        eurobert.spec,
        eurobert.EuroBertEncoder,
        "EuroBERT-210m/610m/2.1B fine-tuned as embedders",
        "mean",
        "bidirectional, grouped-query",
        _FLASH,
        verified="stack, folder",
    ),
    Family(
        model_families.JINA_V5,
        jina_v5.spec,
        jina_v5.JinaV5NanoEncoder,
        "jina-embeddings-v5-text-nano, its task adapters (retrieval, text-matching, clustering, classification) "
        "chosen per request, rows of different tasks in one batch",
        "lasttoken",
        "bidirectional (EuroBERT), grouped-query",
        _FLASH,
        prompts="`Query: ` / `Document: `",
        verified="adapters",
    ),
    Family(
        model_families.CLIP,
        clip.spec,
        clip.ClipModel,
        "openai/clip-vit-base-patch32, clip-vit-large-patch14: texts and images into one space",
        "end-of-text token (text), class token (images)",
        "text causal; images bidirectional over their patches",
        "text: " + _FLASH + "; images: SDPA over [images, patches]",
        verified="towers",
    ),
    Family(
        model_families.SIGLIP,
        siglip.spec,
        siglip.SiglipModel,
        "google/siglip-base-patch16-224, siglip2-base-patch16-224, siglip2-base-patch16-naflex (each image at its own grid)",
        "last position of rows padded to 64 (text), attention-pooling head (images)",
        "bidirectional (texts padded, unmasked, as trained); images bidirectional over their patches",
        "text: " + _FLASH + "; images: SDPA over [images, patches] (NaFlex: each image over its own)",
        verified="towers",
    ),
    Family(
        model_families.COLQWEN2,
        colqwen2.spec,
        colqwen2.ColQwen2Model,
        "vidore/colqwen2-v1.0-hf: queries and document pages (images, each at its own size), a 128-wide vector "
        "per token for late interaction (MaxSim)",
        "none: a vector per token (`multivector`)",
        "causal, grouped-query, plain 1-D positions (as transformers' ColQwen2ForRetrieval); a page's image "
        "through Qwen2-VL's vision tower, bidirectional within the image",
        "FlashInfer (head size 64/128/256) or PyTorch flash varlen, eager (token vectors); images: the vision "
        "tower, SDPA image by image",
        prompts="queries: `Query: {text}` + 10 pad tokens + `\\n`; pages: `<\\|im_start\\|>user\\n"
        "<\\|vision_start\\|>{image}<\\|vision_end\\|>Describe the image.<\\|im_end\\|><\\|endoftext\\|>`",
        verified="pages",
    ),
)


# what the words of ``Family.verified`` stand for (make test, CPU, fp32)
_VERIFIED = {
    "states": "hidden states = transformers",
    "stack": "HTTP→worker = sentence-transformers",
    "logits": "classifier logits = transformers",
    "rerank": "reranking via the scorer = transformers",
    "llm": "LLM-reranker scores = sentence-transformers' CrossEncoder",
    "llm-rerank": "LLM reranking via the scorer = sentence-transformers' CrossEncoder",
    "real": "the real all-MiniLM-L6-v2",
    "folder": "a folder's vectors (engine) = sentence-transformers",
    "moe": "v2-moe's vectors (engine, HTTP→worker) = the published definition's forward",
    "towers": "text and image vectors (engine) = transformers' get_text_features / get_image_features",
    "adapters": "each task adapter's vectors, tasks mixed in a batch = the adapter merged into the weights",
    "pages": "query and page token vectors (engine) = transformers' ColQwen2ForRetrieval",
}


def markdown_table() -> str:
    """The "Supported models" table of docs/models.md, made from this registry."""
    rows = [
        "| family | `model_type` | example models | pooling | attention | prompts | CUDA path | verified on CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        dtype = (
            " — float16 overflows: float32 by default (SDPA, no graphs); `--dtype bfloat16` takes this path"
            if f.fp16_overflows
            else ""
        )
        types = ", ".join(f"`{t}`" for t in f.model_types)
        verified = "; ".join(_VERIFIED[w] for w in f.verified.split(", "))
        rows.append(
            f"| {f.name} | {types} | {f.examples} | {f.pooling} | {f.attention} | {f.prompts} | {f.cuda}{dtype} "
            f"| {verified} |"
        )
    return "\n".join(rows)


_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
SUPPORTED_TYPES = tuple(_BY_TYPE)


def family_for(config: dict[str, Any]) -> Family:
    """The family serving this config.json; a ConfigError naming the model_type when none does."""
    model_type = config.get("model_type", "bert")
    if config.get("position_embedding_type") == "rotary" and config.get("model_type", "xlm-roberta") == "xlm-roberta":
        # jina-embeddings-v3 as published (custom code): an XLM-RoBERTa config with rotary positions
        model_type = model_families.JINA_V3.model_types[0]
    family = _BY_TYPE.get(model_type)
    if family is None:
        hints = {
            "gemma3": " (a multimodal Gemma3 checkpoint: serve its text model, model_type 'gemma3_text')",
        }
        hint = hints.get(str(model_type), "")
        raise ConfigError(f"model_type {model_type!r} is not supported{hint} (supported: {', '.join(SUPPORTED_TYPES)})")
    return family


def build(spec: ModelSpec) -> EncoderModel:
    return family_for(spec.config or {"model_type": spec.model_type}).model(spec)


def spec_from_folder(info: ModelInfo) -> ModelSpec:
    """The engine's spec of the model folder ``info`` describes (its config.json, and the answer tokens
    of an LLM reranker), checked: a ConfigError for what the engine does not serve."""
    config = json.loads((info.path / "config.json").read_text())
    family = family_for(config)
    spec = family.spec(config)
    if tokens := info.score_tokens:
        if not family.llm_reranker:
            served = ", ".join(f.name for f in FAMILIES if f.llm_reranker)
            raise ConfigError(
                f"{family.name} causal LMs are not served as LLM rerankers (LogitScore); these families' are: {served}"
            )
        spec = replace(spec, num_labels=1, score_tokens=tokens)
    if spec.activation not in ACTIVATIONS:
        raise ConfigError(f"activation {spec.activation!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    if not spec.head_dim_override and spec.hidden_size % spec.num_heads:
        raise ConfigError("hidden_size is not a multiple of num_attention_heads")
    if spec.num_heads % spec.kv_heads:
        raise ConfigError("num_attention_heads is not a multiple of num_key_value_heads")
    return spec
