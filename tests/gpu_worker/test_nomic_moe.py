"""nomic-embed-text-v2-moe: the mixture-of-experts layer against a per-token loop of the published
definition (router softmax, top-k, the experts' outputs weighted by their probabilities and summed,
one bias), both ways the layer runs its experts; a tiny v2-moe folder (the published config keys and
tensor names, written by hand: transformers has no NomicBERT class with experts) through the
tokenizer and one packed engine batch, against a plain padded forward of the published definition;
and the refusals of what is not implemented."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer

from embedfleet.services.gpu_worker.engine.layers.moe import MoEMLP
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
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


def _is_moe(layer: int) -> bool:
    return layer % EVERY_N == 1  # the published rule: layers 1, 3, ...


# -- the layer --------------------------------------------------------------------------------------


def _per_token(layer: MoEMLP, x: torch.Tensor, top_k: int, renormalise: bool = False) -> torch.Tensor:
    """The published definition, one token at a time: [T, H] -> [T, H]."""
    out = []
    for token in x:
        probs = torch.softmax(layer.router.weight @ token, dim=0)
        weights, chosen = probs.topk(top_k)
        if renormalise:
            weights = weights / weights.sum()
        y = layer.bias.clone()
        for w, e in zip(weights, chosen.tolist()):
            y += w * (F.gelu(layer.w1[e] @ token) @ layer.w2[e])
        out.append(y)
    return torch.stack(out)


def _random_moe(num_experts: int, top_k: int, hidden: int = 32, inner: int = 48) -> MoEMLP:
    torch.manual_seed(0)
    layer = MoEMLP(hidden, inner, num_experts, top_k, "gelu")
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_moe_layer_equals_the_published_definition_per_token(top_k):
    layer = _random_moe(4, top_k)
    x = torch.randn(96, 32)
    with torch.inference_mode():
        want = _per_token(layer, x, top_k)
        weights, experts = layer.route(x)
        assert sorted(set(experts.flatten().tolist())) == [0, 1, 2, 3]  # every expert has tokens
        for run in (layer.grouped, layer.dense):  # eager, and as a CUDA graph captures it
            got = run(x, weights, experts) + layer.bias
            assert torch.allclose(got, want, atol=1e-5), run.__name__
            assert cosines(got.numpy(), want.numpy()).min() >= 0.9999
        got = layer(x, LinearOps(), residual=x)
        assert torch.allclose(got, want + x, atol=1e-5)
        if top_k < 4:  # the weights are the probabilities as they are: renormalised ones differ
            assert not torch.allclose(got, _per_token(layer, x, top_k, renormalise=True) + x, atol=1e-3)


def test_moe_layer_takes_experts_with_no_tokens_and_empty_batches():
    layer = _random_moe(8, 2)
    x = torch.randn(3, 32)  # 6 choices: some of the 8 experts get none
    with torch.inference_mode():
        assert torch.allclose(layer(x, LinearOps()), _per_token(layer, x, 2), atol=1e-5)
        assert layer(x[:0], LinearOps()).shape == (0, 32)


# -- a v2-moe folder through the engine ---------------------------------------------------------------

# v1's shape with biases: SwiGLU dense layers (fc12 the gate, fc11 the up projection), fc1 biased, fc2 not
GATED = CONFIG | {"activation_function": "swiglu", "num_experts": 0, "mlp_fc2_bias": False}


def _moe_layer(config: dict, layer: int) -> bool:
    return bool(config["num_experts"]) and _is_moe(layer)


def _tensors(config: dict) -> dict[str, torch.Tensor]:
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
        if _moe_layer(config, i):
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


def _make_folder(root: Path, config: dict) -> Path:
    """The tiny NomicBERT folder's tokenizer and sentence-transformers modules (mean pooling, Normalize,
    the search_query / search_document prompts) around ``config`` and its checkpoint."""
    folder = build("nomic_bert", root)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(_tensors(config), folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return _make_folder(tmp_path_factory.mktemp("nomic-moe"), CONFIG)


def _rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions 0.. on x [B, L, heads, d], halves rotated (rotary_emb_interleaved false)."""
    d, length = x.shape[-1], x.shape[1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv)  # [L, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None].float()
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None].float()
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _reference(
    config: dict, ids: torch.Tensor, mask: torch.Tensor, used: list[set[int]], renormalise: bool = False
) -> torch.Tensor:
    """The published NomicBertModel on a padded batch (ids, mask [B, L]), mean-pooled and normalised: [B, H].
    ``used`` collects the experts each mixture-of-experts layer picked for real tokens."""
    t = _tensors(config)
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
        q, k = _rotate(q, config["rotary_emb_base"]), _rotate(k, config["rotary_emb_base"])
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + keys
        attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, length, H)
        x = ln(x + linear(attn, p + "attn.out_proj"), p + "norm1")
        if _moe_layer(config, i):
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


def _tokenize(folder: Path, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, L]: the folder's tokenizer, cut at the model's limit, padded."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    tokenizer.enable_padding(pad_id=0)
    batch = tokenizer.encode_batch(texts)
    return torch.tensor([e.ids for e in batch]), torch.tensor([e.attention_mask for e in batch], dtype=torch.float32)


def _reference_vectors(folder: Path, texts: list[str], config: dict = CONFIG, renormalise: bool = False) -> np.ndarray:
    ids, mask = _tokenize(folder, texts)
    used: list[set[int]] = [set() for _ in range(LAYERS)]
    with torch.inference_mode():
        vectors = _reference(config, ids, mask, used, renormalise).numpy()
    assert all(used[i] == set(range(EXPERTS)) for i in range(LAYERS) if _moe_layer(config, i))  # all have tokens
    return vectors


def test_v2_moe_folder_vectors_equal_the_published_forward(folder):
    texts = mixed_texts(16)  # queries to whole documents, in one packed batch
    lengths = _tokenize(folder, texts)[1].sum(1)
    assert len(set(lengths.tolist())) > 8 and lengths.max() == MAX_SEQ_LENGTH  # many lengths, some cut
    got = engine_vectors(folder, texts)
    assert got.shape == (16, H)
    assert cosines(got, _reference_vectors(folder, texts)).min() >= 0.9999
    # the test can tell: renormalised top-k weights make other vectors
    assert cosines(got, _reference_vectors(folder, texts, renormalise=True)).min() < 0.9999


def test_v2_moe_folder_with_prompts(folder):
    texts = mixed_texts(16)[:6]
    got = engine_vectors(folder, texts, "query")
    assert cosines(got, _reference_vectors(folder, ["search_query: " + t for t in texts])).min() >= 0.9999


def _interleave(w: torch.Tensor) -> torch.Tensor:
    """Rows (or a bias's entries) [x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}] of each head as [x_0, y_0, x_1, y_1, ...]."""
    heads = w.view(HEADS, 2, H // HEADS // 2, -1)  # [heads, halves, d/2, in]
    return heads.transpose(1, 2).reshape(w.shape)


def test_interleaved_rotary_pairs_reorder_the_qkv_biases_too(folder, tmp_path):
    interleaved = shutil.copytree(folder, tmp_path / "interleaved")
    tensors = _tensors(CONFIG)
    for name in [n for n in tensors if ".attn.Wqkv." in n]:
        q, k, v = tensors[name].chunk(3)
        tensors[name] = torch.cat([_interleave(q), _interleave(k), v]).contiguous()
    save_file(tensors, interleaved / "model.safetensors")
    texts = mixed_texts(16)[:6]
    want = _reference_vectors(folder, texts)
    edit_config(interleaved, rotary_emb_interleaved=True)
    assert cosines(engine_vectors(interleaved, texts), want).min() >= 0.9999
    edit_config(interleaved, rotary_emb_interleaved=False)
    assert cosines(engine_vectors(interleaved, texts), want).min() < 0.999  # the layout matters


def test_gated_dense_layers_with_their_own_biases(tmp_path):
    """SwiGLU dense layers (v1's) with the bias flags set apart: fc11 and fc12 biased, fc2 not."""
    folder = _make_folder(tmp_path, GATED)
    texts = mixed_texts(16)[:6]
    assert cosines(engine_vectors(folder, texts), _reference_vectors(folder, texts, GATED)).min() >= 0.9999


# -- refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"moe_router_jitter_eps": 0.01}, "mixture-of-experts option 'moe_router_jitter_eps' is not supported"),
        ({"moe_normalize_expert_weights": 2.0}, r"moe_normalize_expert_weights 2\.0 is not supported"),
        ({"expert_choice_router": True}, "expert_choice_router True is not supported"),
        ({"num_shared_experts": 1}, "num_shared_experts 1 is not supported"),
        ({"moe_impl": "contrastors"}, "moe_impl 'contrastors' is not supported"),
        ({"ffn_div": 2}, "ffn_div 2 is not supported"),
        ({"moe_every_n_layers": 1}, "moe_every_n_layers 1 is not supported"),
        ({"moe_every_n_layers": None}, "moe_every_n_layers 0 is not supported"),
        ({"moe_top_k": 5}, "moe_top_k 5 must be between 1 and num_experts 4"),
        ({"activation_function": "swiglu"}, r"mixture-of-experts layers with a gated activation \(swiglu\)"),
    ],
)
def test_v2_moe_refuses_what_it_does_not_implement(folder, tmp_path, changes, message):
    refused = shutil.copytree(folder, tmp_path / "refused")
    edit_config(refused, **changes)
    with pytest.raises(ConfigError, match=message):
        spec_from_folder(load_model_info(str(refused)))


def test_v2_moe_training_options_are_read_as_no_change(folder, tmp_path):
    """router_aux_loss_coef and moe_resid_pdrop change training only: any value is served."""
    other = shutil.copytree(folder, tmp_path / "other")
    edit_config(other, router_aux_loss_coef=10.0, moe_resid_pdrop=0.3)
    assert spec_from_folder(load_model_info(str(other))).num_layers == LAYERS
