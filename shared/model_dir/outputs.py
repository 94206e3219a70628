"""Outputs beyond one dense vector a text: sparse vectors (a SPLADE folder, BGE-M3's sparse head) and a
vector per token (a multi-vector encoder's folder, BGE-M3's ColBERT head)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.folder import ModelFolder, read_json
from embedfleet.shared.model_dir.stack import DenseSpec, check_dense_chain, read_dense

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
    normalised. ColQwen2: its checkpoint's embedding_proj_layer on every token, normalised.
    """

    dense: tuple[DenseSpec, ...] = ()  # Dense layers applied to every token's state
    linear: Path | None = None  # BGE-M3: the colbert_linear file ("weight" [out, in], "bias" [out])
    # a Linear kept in the model's own checkpoint, by its tensors' prefix (ColQwen2: "embedding_proj_layer",
    # its "<prefix>.weight" [out, hidden] and "<prefix>.bias" [out]); "": none
    checkpoint: str = ""
    normalize: bool = True
    skip_first: bool = False  # BGE-M3: the first (CLS) token has no vector
    skiplist_words: tuple[str, ...] = ()  # tokens dropped from the vectors of the skiplist's tasks
    skiplist_tasks: tuple[str, ...] = ("document",)  # a request of no input type counts as "document"
    dim: int = 0  # vector size
    skiplist_ids: tuple[int, ...] = ()  # the skiplist's words that are single vocabulary tokens, as ids


def is_sparse_encoder(folder: ModelFolder) -> bool:
    kinds = folder.kinds
    return "SpladePooling" in kinds or "MLMTransformer" in kinds


def is_multi_vector_encoder(folder: ModelFolder) -> bool:
    return "MultiVectorMask" in folder.kinds or folder.st_general.get("model_type") == "MultiVectorEncoder"


def splade(folder: ModelFolder) -> SparseSpec:
    """sentence-transformers' SparseEncoder folder: MLMTransformer -> SpladePooling, nothing else."""
    kinds = folder.kinds
    if kinds != ["MLMTransformer", "SpladePooling"]:
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: of sparse encoders only MLMTransformer -> SpladePooling "
            "(SPLADE) is supported"
        )
    architectures = [str(a) for a in folder.config.get("architectures") or []]
    if not any(a.endswith("ForMaskedLM") for a in architectures):
        raise ConfigError(
            f"a SPLADE folder needs a …ForMaskedLM checkpoint (config.json names {architectures or 'none'})"
        )
    where = folder.module_dir(folder.modules[1], "1_SpladePooling") / "config.json"
    pooling = read_json(where)
    strategy = str(pooling.get("pooling_strategy", "max"))
    activation = str(pooling.get("activation_function", "relu"))
    if strategy not in SPARSE_POOLINGS or activation not in SPARSE_ACTIVATIONS:
        raise ConfigError(
            f"{where}: pooling_strategy {strategy!r} / activation_function {activation!r} is not "
            f"supported (supported: {', '.join(SPARSE_POOLINGS)} / {', '.join(SPARSE_ACTIVATIONS)})"
        )
    return SparseSpec("mlm", strategy, activation)


def multi_vector(folder: ModelFolder, hidden_size: int) -> MultiVectorSpec:
    """sentence-transformers' MultiVectorEncoder folder: Transformer -> Dense* -> MultiVectorMask? -> Normalize?"""
    order = ("Transformer", "Dense", "MultiVectorMask", "Normalize")
    kinds, dense, mask, normalize = [], [], {}, False
    for module in folder.modules:
        kind = module.kind
        if kind not in order or not module.type.startswith(("sentence_transformers.", "pylate.")):
            raise ConfigError(
                f"modules.json module {module.type!r} is not supported in a multi-vector encoder "
                f"(supported: {', '.join(order)})"
            )
        kinds.append(kind)
        if kind == "Dense":
            dense.append(read_dense(folder.module_dir(module), "token_embeddings"))
        elif kind == "MultiVectorMask":
            mask = read_json(folder.module_dir(module) / "config.json")
        elif kind == "Normalize":
            normalize = True
    ranks = [order.index(k) for k in kinds]
    if (
        not kinds
        or kinds[0] != "Transformer"
        or ranks != sorted(ranks)
        or any(kinds.count(k) > 1 for k in order if k != "Dense")
    ):
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: a multi-vector encoder must run "
            "Transformer -> Dense (any number) -> MultiVectorMask -> Normalize"
        )
    for key in ("query_expansion", "query_length", "document_length"):
        if folder.st_config.get(key) is not None:
            raise ConfigError(
                f"{folder.path / 'sentence_bert_config.json'}: {key} is set; per-task lengths and query "
                "expansion of multi-vector encoders are not supported"
            )
    if mask.get("keep_only_token_ids"):
        raise ConfigError("MultiVectorMask keep_only_token_ids (image-patch documents) is not supported")
    tasks = mask.get("skiplist_tasks", ["document"])
    dense_t = tuple(dense)
    check_dense_chain(dense_t, hidden_size)
    words = tuple(str(w) for w in mask.get("skiplist_words") or ())
    return MultiVectorSpec(
        dense=dense_t,
        normalize=normalize,
        skiplist_words=words,
        skiplist_ids=_vocab_ids(folder.path, words),
        skiplist_tasks=tuple([tasks] if isinstance(tasks, str) else tasks),
        dim=dense_t[-1].out_features if dense_t else hidden_size,
    )


def bge_m3_heads(folder: ModelFolder) -> tuple[SparseSpec | None, MultiVectorSpec | None]:
    """BGE-M3's sparse_linear [1, hidden] and colbert_linear [out, hidden] heads, when the folder has them."""
    path = folder.path
    sparse_file = next((path / n for n in BGE_M3_SPARSE if (path / n).is_file()), None)
    colbert_file = next((path / n for n in BGE_M3_COLBERT if (path / n).is_file()), None)
    if sparse_file is not None and sparse_file.suffix != ".safetensors":
        _pickled(sparse_file)
        sparse_file = None
    if colbert_file is not None and colbert_file.suffix != ".safetensors":
        _pickled(colbert_file)
        colbert_file = None
    sparse = multivector = None
    if sparse_file is not None:
        # FlagEmbedding gives no lexical weight to the tokenizer's cls, eos, pad and unk tokens
        names = []
        for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = folder.tok_config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                names.append(token)
        dropped = set(_vocab_ids(path, tuple(names), keep_unknown=True))
        sparse = SparseSpec("linear", weights=sparse_file, dropped=tuple(sorted(dropped)))
    if colbert_file is not None:
        from embedfleet.shared.model_dir.linear_heads import linear_shape  # reads the file's header only

        out, _ = linear_shape(colbert_file)
        multivector = MultiVectorSpec(linear=colbert_file, normalize=True, skip_first=True, dim=out, skiplist_tasks=())
    return sparse, multivector


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
    unk = (
        tokenizer.token_to_id(str(getattr(tokenizer.model, "unk_token", "") or ""))
        if hasattr(tokenizer.model, "unk_token")
        else None
    )
    ids = [tokenizer.token_to_id(w) for w in words]
    return tuple(sorted({i for i in ids if i is not None and (keep_unknown or i != unk)}))


def _pickled(path: Path) -> None:
    """A head saved only as a torch pickle: served without it (dense vectors still are), with the fix logged."""
    from embedfleet.shared.model_dir.linear_heads import pickled_head

    logging.getLogger("embedfleet.model").warning(
        "%s; until then the folder serves no output of that head", pickled_head(path)
    )
