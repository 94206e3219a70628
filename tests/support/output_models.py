"""Tiny random-weight folders for the outputs beyond one dense vector, and their references.

- ``build_splade``: a BertForMaskedLM saved as sentence-transformers' SparseEncoder
  (MLMTransformer -> SpladePooling); reference ``SparseEncoder.encode``.
- ``build_colbert``: a BERT saved as sentence-transformers' MultiVectorEncoder (Transformer -> Dense
  per token -> MultiVectorMask with a punctuation skiplist -> Normalize); reference ``encode_query`` /
  ``encode_document``.
- ``build_bge_m3``: BGE-M3's layout (FlagEmbedding): an encoder saved with CLS pooling and Normalize,
  beside ``sparse_linear.pt`` and ``colbert_linear.pt``; reference ``bge_m3_reference``, which runs
  the checkpoint's own modules (transformers' encoder and the two torch Linear heads) by FlagEmbedding's rules.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tests.support.tiny_models import _randomize, build

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _restore_tokenizer(src: Path, dst: Path) -> None:
    """sentence-transformers' save rewrites the tokenizer files in transformers 5's form: put the plain ones back."""
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dst / name)


def build_splade(root: Path, pooling: str = "max", activation: str = "relu") -> Path:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import AutoConfig, BertForMaskedLM

    base = build("bert", root / "splade-base")
    folder = root / f"splade-{pooling}-{activation}"
    mlm_dir = root / "splade-mlm"
    torch.manual_seed(1)
    model = BertForMaskedLM(AutoConfig.from_pretrained(base))
    _randomize(model)
    model.save_pretrained(mlm_dir, safe_serialization=True)
    _restore_tokenizer(base, mlm_dir)
    encoder = SparseEncoder(modules=[MLMTransformer(str(mlm_dir)), SpladePooling(pooling, activation)], device="cpu")
    encoder.save(str(folder))
    _restore_tokenizer(base, folder)
    return folder


def splade_reference(folder: Path, texts: list[str]) -> np.ndarray:
    """SparseEncoder.encode, densified: [n, vocab] float32."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(folder), device="cpu")
    return encoder.encode(texts, convert_to_tensor=True).to_dense().float().numpy()


def build_colbert(root: Path) -> Path:
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    base = build("bert", root / "colbert-base")
    folder = root / "colbert"
    torch.manual_seed(2)
    hidden = json.loads((base / "config.json").read_text())["hidden_size"]
    dense = Dense(
        hidden,
        16,
        bias=False,
        activation_function=nn.Identity(),
        module_input_name="token_embeddings",
        module_output_name="token_embeddings",
    )
    nn.init.normal_(dense.linear.weight, 0.0, 0.3)
    modules = [
        Transformer(str(base)),
        dense,
        MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings", module_output_name="token_embeddings"),
    ]
    MultiVectorEncoder(modules=modules, device="cpu").save(str(folder))
    _restore_tokenizer(base, folder)
    return folder


def colbert_reference(folder: Path, texts: list[str], task: str) -> list[np.ndarray]:
    """MultiVectorEncoder.encode_query / encode_document: per text [tokens, dim] float32."""
    from sentence_transformers import MultiVectorEncoder

    encoder = MultiVectorEncoder(str(folder), device="cpu")
    encode = encoder.encode_query if task == "query" else encoder.encode_document
    return [v.float().numpy() for v in encode(texts)]


def build_bge_m3(root: Path, colbert_dim: int = 24) -> Path:
    base = build("bert", root / "m3-base")
    folder = root / "bge-m3"
    shutil.copytree(base, folder)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    torch.manual_seed(3)
    sparse, colbert = nn.Linear(hidden, 1), nn.Linear(hidden, colbert_dim)
    for head in (sparse, colbert):
        nn.init.normal_(head.weight, 0.0, 0.3)
        nn.init.normal_(head.bias, 0.1, 0.1)
    # FlagEmbedding saves torch pickles (sparse_linear.pt, colbert_linear.pt), which are served once
    # converted to safetensors: the tests write the converted files
    save_file({k: v.contiguous() for k, v in sparse.state_dict().items()}, str(folder / "sparse_linear.safetensors"))
    save_file({k: v.contiguous() for k, v in colbert.state_dict().items()}, str(folder / "colbert_linear.safetensors"))
    # BGE-M3's sentence-transformers stack: CLS pooling, Normalize
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    for key in list(pooling):
        if key.startswith("pooling_mode_"):
            pooling[key] = key == "pooling_mode_cls_token"
    if "pooling_mode" in pooling:
        pooling["pooling_mode"] = "cls"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def bge_m3_reference(folder: Path, texts: list[str]) -> dict[str, list]:
    """FlagEmbedding's three outputs from the checkpoint's own modules, one text at a time:
    dense = normalise(h[CLS]); sparse = {token id: max relu(sparse_linear(h))} without cls/eos/pad/unk;
    colbert = normalise(colbert_linear(h[1:]))."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    sparse_linear = _load_linear(folder / "sparse_linear.safetensors")
    colbert_linear = _load_linear(folder / "colbert_linear.safetensors")
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    out: dict[str, list] = {"dense": [], "sparse": [], "colbert": []}
    with torch.no_grad():
        for text in texts:
            enc = tokenizer(text, return_tensors="pt")
            h = model(**enc).last_hidden_state[0]
            out["dense"].append(torch.nn.functional.normalize(h[0], dim=-1).numpy())
            weights = torch.relu(sparse_linear(h)).squeeze(-1).tolist()
            lexical: dict[int, float] = {}
            for token, w in zip(enc["input_ids"][0].tolist(), weights):
                if token not in unused and w > 0 and w > lexical.get(token, 0.0):
                    lexical[token] = w
            out["sparse"].append(lexical)
            out["colbert"].append(torch.nn.functional.normalize(colbert_linear(h[1:]), dim=-1).numpy())
    return out


def _load_linear(path: Path) -> nn.Linear:
    state = load_file(str(path))
    linear = nn.Linear(state["weight"].shape[1], state["weight"].shape[0])
    linear.load_state_dict(state)
    return linear.eval()


def densify(indices: np.ndarray, values: np.ndarray, dim: int) -> np.ndarray:
    row = np.zeros(dim, dtype=np.float32)
    row[indices] = values
    return row
