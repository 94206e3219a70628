"""A tiny nomic-embed-text-v2-moe folder (the published config keys and tensor names, written by hand:
transformers has no NomicBERT class with experts) and the published definition's forward on a padded
batch, its reference: for the engine's tests and the whole stack's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer

from tests.support.tiny_models import MAX_POSITIONS, MAX_SEQ_LENGTH, build

# the tiny model: nomic-embed-text-v2-moe's config with small sizes (and the MiniLM tokenizer's
# vocabulary where the real one has XLM-R's 250048 tokens)
H, HEADS, LAYERS, INNER, EXPERTS, TOP_K, EVERY_N, VOCAB = 64, 4, 4, 128, 4, 2, 2, 30522
CONFIG = {
    "architectures": ["NomicBertModel"],
    "auto_map": {
        "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
        "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
    },
    "model_type": "nomic_bert",
    "activation_function": "gelu",
    "add_pooling_layer": False,
    "causal": False,
    "expert_choice_router": False,
    "ffn_div": 1,
    "layer_norm_epsilon": 1e-5,
    "max_trained_positions": MAX_POSITIONS,
    "mlp_fc1_bias": True,
    "mlp_fc2_bias": True,
    "moe_every_n_layers": EVERY_N,
    "moe_impl": "megablocks",
    "moe_normalize_expert_weights": False,
    "moe_resid_pdrop": 0.0,
    "moe_top_k": TOP_K,
    "n_embd": H,
    "n_head": HEADS,
    "n_inner": INNER,
    "n_layer": LAYERS,
    "n_positions": MAX_POSITIONS,
    "num_experts": EXPERTS,
    "num_shared_experts": 0,
    "pad_token_id": 0,
    "prenorm": False,
    "qkv_proj_bias": True,
    "rotary_emb_base": 10000,
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_scaling_factor": None,
    "router_aux_loss_coef": 0.1,
    "type_vocab_size": 1,
    "use_rms_norm": None,
    "vocab_size": VOCAB,
}


def is_moe(layer: int) -> bool:
    return layer % EVERY_N == 1  # the published rule: layers 1, 3, ...


# v1's shape with biases: SwiGLU dense layers (fc12 the gate, fc11 the up projection), fc1 biased, fc2 not
GATED = CONFIG | {"activation_function": "swiglu", "num_experts": 0, "mlp_fc2_bias": False}


def moe_layer(config: dict, layer: int) -> bool:
    return bool(config["num_experts"]) and is_moe(layer)


def tensors(config: dict) -> dict[str, torch.Tensor]:
    """Random weights under the published names, biases where the config has them: N(0, 0.1), the
    router's and the experts' N(0, 0.3) (tokens spread over the experts, outputs that move the
    residual); norm scales 1 + N(0, 0.1)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, mean: float = 0.0, std: float = 0.1) -> torch.Tensor:
        return mean + std * torch.randn(*shape, generator=gen)

    def linear(name: str, out: int, into: int, bias: bool) -> dict[str, torch.Tensor]:
        return {name + ".weight": rand(out, into)} | ({name + ".bias": rand(out)} if bias else {})

    t = {
        "embeddings.word_embeddings.weight": rand(VOCAB, H),
        "embeddings.token_type_embeddings.weight": rand(1, H),
        "emb_ln.weight": rand(H, mean=1.0),
        "emb_ln.bias": rand(H),
    }
    up_bias, down_bias = config["mlp_fc1_bias"], config["mlp_fc2_bias"]
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        t |= linear(p + "attn.Wqkv", 3 * H, H, config["qkv_proj_bias"])
        t |= linear(p + "attn.out_proj", H, H, config["qkv_proj_bias"])
        for norm in ("norm1", "norm2"):
            t |= {f"{p}{norm}.weight": rand(H, mean=1.0), f"{p}{norm}.bias": rand(H)}
        if moe_layer(config, i):
            t |= {
                p + "mlp.router.layer.weight": rand(EXPERTS, H, std=0.3),
                p + "mlp.experts.mlp.w1": rand(EXPERTS * INNER, H, std=0.3),
                p + "mlp.experts.mlp.w2": rand(EXPERTS * INNER, H, std=0.3),
                p + "mlp.experts.bias": rand(H),
            }
        elif config["activation_function"] == "swiglu":
            t |= linear(p + "mlp.fc11", INNER, H, up_bias) | linear(p + "mlp.fc12", INNER, H, up_bias)
            t |= linear(p + "mlp.fc2", H, INNER, down_bias)
        else:
            t |= linear(p + "mlp.fc1", INNER, H, up_bias) | linear(p + "mlp.fc2", H, INNER, down_bias)
    return t


def make_folder(root: Path, config: dict) -> Path:
    """The tiny NomicBERT folder's tokenizer and sentence-transformers modules (mean pooling, Normalize,
    the search_query / search_document prompts) around ``config`` and its checkpoint."""
    folder = build("nomic_bert", root)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors(config), folder / "model.safetensors")
    return folder


def rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions 0.. on x [B, L, heads, d], halves rotated (rotary_emb_interleaved false)."""
    d, length = x.shape[-1], x.shape[1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv)  # [L, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None].float()
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None].float()
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def reference(
    config: dict, ids: torch.Tensor, mask: torch.Tensor, used: list[set[int]], renormalise: bool = False
) -> torch.Tensor:
    """The published NomicBertModel on a padded batch (ids, mask [B, L]), mean-pooled and normalised: [B, H].
    ``used`` collects the experts each mixture-of-experts layer picked for real tokens."""
    t = tensors(config)
    eps = config["layer_norm_epsilon"]
    b, length = ids.shape
    d = H // HEADS

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (H,), t[name + ".weight"], t[name + ".bias"], eps)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, t[name + ".weight"], t.get(name + ".bias"))

    x = ln(t["embeddings.word_embeddings.weight"][ids] + t["embeddings.token_type_embeddings.weight"][0], "emb_ln")
    keys = torch.where(mask.bool(), 0.0, -math.inf)[:, None, None, :]  # [B, 1, 1, L]: padding masked
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        q, k, v = linear(x, p + "attn.Wqkv").view(b, length, 3, HEADS, d).unbind(2)
        q, k = rotate(q, config["rotary_emb_base"]), rotate(k, config["rotary_emb_base"])
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + keys
        attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, length, H)
        x = ln(x + linear(attn, p + "attn.out_proj"), p + "norm1")
        if moe_layer(config, i):
            flat = x.reshape(-1, H)
            probs = (flat @ t[p + "mlp.router.layer.weight"].T).softmax(-1, dtype=torch.float32)
            weights, chosen = probs.topk(TOP_K, dim=-1)
            if renormalise:
                weights = weights / weights.sum(-1, keepdim=True)
            w1 = t[p + "mlp.experts.mlp.w1"].view(EXPERTS, INNER, H)
            w2 = t[p + "mlp.experts.mlp.w2"].view(EXPERTS, INNER, H)
            y = torch.zeros_like(flat)
            for e in range(EXPERTS):  # as the published code does it: each expert over the tokens that chose it
                token, slot = torch.where(chosen == e)
                y.index_add_(0, token, weights[token, slot, None] * (F.gelu(flat[token] @ w1[e].T) @ w2[e]))
            used[i] |= set(chosen[mask.reshape(-1).bool()].flatten().tolist())
            y = (y + t[p + "mlp.experts.bias"]).view(b, length, H)
        elif config["activation_function"] == "swiglu":
            y = linear(F.silu(linear(x, p + "mlp.fc12")) * linear(x, p + "mlp.fc11"), p + "mlp.fc2")
        else:
            y = linear(F.gelu(linear(x, p + "mlp.fc1")), p + "mlp.fc2")
        x = ln(x + y, p + "norm2")
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return F.normalize(pooled, dim=-1)


def tokenize(folder: Path, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, L]: the folder's tokenizer, cut at the model's limit, padded."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    tokenizer.enable_padding(pad_id=0)
    batch = tokenizer.encode_batch(texts)
    return torch.tensor([e.ids for e in batch]), torch.tensor([e.attention_mask for e in batch], dtype=torch.float32)


def reference_vectors(folder: Path, texts: list[str], config: dict = CONFIG, renormalise: bool = False) -> np.ndarray:
    ids, mask = tokenize(folder, texts)
    used: list[set[int]] = [set() for _ in range(LAYERS)]
    with torch.inference_mode():
        vectors = reference(config, ids, mask, used, renormalise).numpy()
    assert all(used[i] == set(range(EXPERTS)) for i in range(LAYERS) if moe_layer(config, i))  # all have tokens
    return vectors
