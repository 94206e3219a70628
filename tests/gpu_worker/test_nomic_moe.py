"""nomic-embed-text-v2-moe: the mixture-of-experts layer against a per-token loop of the published
definition (router softmax, top-k, the experts' outputs weighted by their probabilities and summed,
one bias), both ways the layer runs its experts; a tiny v2-moe folder (the published config keys and
tensor names, written by hand: transformers has no NomicBERT class with experts) through the
tokenizer and one packed engine batch, against a plain padded forward of the published definition;
and the refusals of what is not implemented."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from embedfleet.services.gpu_worker.engine.layers.moe import MoEMLP
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.registry import spec_from_folder
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.corpus import mixed_texts
from tests.support.engine_folders import edit_config, engine_vectors
from tests.support.nomic_moe import (
    CONFIG,
    GATED,
    HEADS,
    LAYERS,
    MAX_SEQ_LENGTH,
    H,
    make_folder,
    reference_vectors,
    tensors,
    tokenize,
)

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


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("nomic-moe"), CONFIG)


def test_v2_moe_folder_vectors_equal_the_published_forward(folder):
    texts = mixed_texts(16)  # queries to whole documents, in one packed batch
    lengths = tokenize(folder, texts)[1].sum(1)
    assert len(set(lengths.tolist())) > 8 and lengths.max() == MAX_SEQ_LENGTH  # many lengths, some cut
    got = engine_vectors(folder, texts)
    assert got.shape == (16, H)
    assert cosines(got, reference_vectors(folder, texts)).min() >= 0.9999
    # the test can tell: renormalised top-k weights make other vectors
    assert cosines(got, reference_vectors(folder, texts, renormalise=True)).min() < 0.9999


def test_v2_moe_folder_with_prompts(folder):
    texts = mixed_texts(16)[:6]
    got = engine_vectors(folder, texts, "query")
    assert cosines(got, reference_vectors(folder, ["search_query: " + t for t in texts])).min() >= 0.9999


def _interleave(w: torch.Tensor) -> torch.Tensor:
    """Rows (or a bias's entries) [x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}] of each head as [x_0, y_0, x_1, y_1, ...]."""
    heads = w.view(HEADS, 2, H // HEADS // 2, -1)  # [heads, halves, d/2, in]
    return heads.transpose(1, 2).reshape(w.shape)


def test_interleaved_rotary_pairs_reorder_the_qkv_biases_too(folder, tmp_path):
    interleaved = shutil.copytree(folder, tmp_path / "interleaved")
    weights = tensors(CONFIG)
    for name in [n for n in weights if ".attn.Wqkv." in n]:
        q, k, v = weights[name].chunk(3)
        weights[name] = torch.cat([_interleave(q), _interleave(k), v]).contiguous()
    save_file(weights, interleaved / "model.safetensors")
    texts = mixed_texts(16)[:6]
    want = reference_vectors(folder, texts)
    edit_config(interleaved, rotary_emb_interleaved=True)
    assert cosines(engine_vectors(interleaved, texts), want).min() >= 0.9999
    edit_config(interleaved, rotary_emb_interleaved=False)
    assert cosines(engine_vectors(interleaved, texts), want).min() < 0.999  # the layout matters


def test_gated_dense_layers_with_their_own_biases(tmp_path):
    """SwiGLU dense layers (v1's) with the bias flags set apart: fc11 and fc12 biased, fc2 not."""
    folder = make_folder(tmp_path, GATED)
    texts = mixed_texts(16)[:6]
    assert cosines(engine_vectors(folder, texts), reference_vectors(folder, texts, GATED)).min() >= 0.9999


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
