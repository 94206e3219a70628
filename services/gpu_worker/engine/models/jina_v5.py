"""jina-embeddings-v5-text-nano: EuroBERT-210m (eurobert.py) with four task LoRA adapters, applied per
row of a packed batch (layers/lora.py), so rows of different tasks share one forward.

The published folder (jinaai/jina-embeddings-v5-text-nano, as its own modeling code and vLLM's
``model_executor/models/jina.py`` read it):
- config.json: EuroBERT's keys plus ``architectures: ["JinaEmbeddingsV5Model"]``, ``model_type:
  "jina_embeddings_v5"``, ``is_decoder: false`` and ``task_names`` (retrieval, text-matching,
  clustering, classification). jina-embeddings-v5-text-small is a Qwen3 under the same architecture
  and model_type, told apart only by ``is_decoder`` (absent there): it is refused here.
- model.safetensors: the EuroBertModel's tensors, bare (``embed_tokens``, ``layers.N.…``, ``norm``).
- adapters/<task>/adapter_config.json + adapter_model.safetensors: one PEFT LoRA per task, keys
  ``base_model.model.layers.N.self_attn.q_proj.lora_A.weight`` [r, in] and ``….lora_B.weight`` [out, r]
  on the attention and MLP projections; the delta is (lora_alpha / r) * B @ A (alpha / sqrt(r) with
  use_rslora). vLLM merges one task's adapter into the weights; here all four stay apart.
- Pooling: the last token (an encoder pooled as a decoder is), then L2-normalised; prompts
  ``Query: `` / ``Document: `` (the document prompt by default, whatever the task); Matryoshka 32-768.

The adapters live beside the checkpoint, not in it: the loader's ``load_weights`` reads the base
model, then ``load_adapters(folder)`` sizes the adapter layers from the adapters' configs and fills them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention
from embedfleet.services.gpu_worker.engine.layers.lora import LinearAdapters, adapter_mask, stack_linear
from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation
from embedfleet.services.gpu_worker.engine.models import decoder, eurobert
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import task_adapters

# our fused layer -> the checkpoint projections it holds, in its row order
_FUSED = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "out": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
_TARGETS = {p for projections in _FUSED.values() for p in projections}
_PEFT_PREFIXES = ("base_model.model.model.", "base_model.model.")  # PEFT around a ...ForMaskedLM, or the model
_LORA_KEY = re.compile(r"layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.lora_[AB]\.weight")


def spec(config: dict[str, Any]) -> ModelSpec:
    if config.get("is_decoder", True):
        raise ConfigError(
            "jina-embeddings-v5 with a decoder backbone (v5-text-small, Qwen3; is_decoder not false) is not served "
            "yet: its per-task merged folders (model_type qwen3) are"
        )
    if not task_adapters(config):  # the tasks' names, checked as the tokenizer reads them
        raise ConfigError("config.json: task_names must list the model's task adapters (jina-embeddings-v5)")
    return eurobert.spec(config)


class AdaptedOps(LinearOps):
    """The engine's linear ops with each adapted layer's task delta added to its output (before a gated
    layer's activation): the layers' code runs unchanged. One per forward (the batch's masks)."""

    def __init__(self, base: LinearOps, adapters: dict[int, LinearAdapters], masks: dict[int, torch.Tensor]) -> None:
        self.base, self.adapters, self.masks = base, adapters, masks  # id(layer) -> its adapters; rank -> mask

    def _delta(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor | None:
        adapters = self.adapters.get(id(layer))
        return None if adapters is None else adapters(x, self.masks[adapters.rank])

    def linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        out, delta = self.base.linear(x, layer), self._delta(x, layer)
        return out if delta is None else out + delta

    def linear_act(self, x: torch.Tensor, layer: nn.Linear, activation_name: str) -> torch.Tensor:
        return activation(activation_name)(self.linear(x, layer))

    def gated(self, x: torch.Tensor, layer: nn.Linear, activation_name: str) -> torch.Tensor:
        gate, up = self.linear(x, layer).chunk(2, dim=-1)
        return activation(activation_name)(gate) * up

    def linear_add(self, x: torch.Tensor, layer: nn.Linear, residual: torch.Tensor) -> torch.Tensor:
        out, delta = self.base.linear_add(x, layer, residual), self._delta(x, layer)
        return out if delta is None else out + delta


class JinaV5NanoEncoder(eurobert.EuroBertEncoder):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.lora = nn.ModuleList()  # per layer {"qkv", "out", "gate_up", "down"}: LinearAdapters (load_adapters)
        self._adapted: dict[int, LinearAdapters] = {}  # id(an adapted nn.Linear) -> its adapters

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        if not self.adapter_names:
            # rows asking for a task would silently get the base model's vectors
            raise ConfigError("jina-embeddings-v5's task adapters are not loaded (load_adapters after load_weights)")
        dtype, count = self.word.weight.dtype, len(self.adapter_names)
        ranks = {a.rank for a in self._adapted.values()}
        masks = {r: adapter_mask(batch.adapters, count, r, dtype) for r in ranks}  # [T, count * r] each
        return super().forward(batch, attention, AdaptedOps(ops, self._adapted, masks))

    def load_adapters(self, folder: Path) -> None:
        """Read ``folder``'s adapters/<task>/ (config.json's task_names, in order: adapter i + 1 is the
        i-th) into per-layer stacked LinearAdapters, each task's scale folded into its B."""
        tasks = tuple(self.spec.config["task_names"])
        read = [_read_adapter(folder / "adapters" / task, self.spec.num_layers) for task in tasks]
        rank = max(r for r, _, _ in read)
        widths = _widths(self.spec)
        device, dtype = self.word.weight.device, self.word.weight.dtype
        self.lora, self._adapted = nn.ModuleList(), {}
        for i, block in enumerate(self.layers):
            assert isinstance(block, decoder.Block)
            linears = {
                "qkv": block.attn.qkv,
                "out": block.attn.out,
                "gate_up": block.mlp.gate_up,
                "down": block.mlp.down,
            }
            adapters = nn.ModuleDict()
            for name, projections in _FUSED.items():
                base = linears[name]
                a_list, b_list = [], []
                for _, scale, tensors in read:
                    pairs = [
                        _pair(tensors, f"layers.{i}.{_module(p)}.{p}", base.in_features, widths[p], rank)
                        for p in projections
                    ]
                    a_list.append(torch.cat([a for a, _ in pairs]))  # [k * rank, in]
                    b_list.append(torch.block_diag(*[b for _, b in pairs]) * scale)  # [out, k * rank]
                a, b = stack_linear(a_list, b_list, 1.0)
                adapted = LinearAdapters(base.in_features, base.out_features, len(tasks), len(projections) * rank)
                adapted.a.data.copy_(a)
                adapted.b.data.copy_(b)
                adapters[name] = adapted.to(device, dtype)
                self._adapted[id(base)] = adapted
            self.lora.append(adapters)
        self.adapter_names = tasks


def _module(projection: str) -> str:
    return "self_attn" if projection in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


def _widths(spec: ModelSpec) -> dict[str, int]:
    """Each projection's output width (grouped-query: k and v narrower than q)."""
    q, kv = spec.num_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    inter, hidden = spec.intermediate_size, spec.hidden_size
    return dict(q_proj=q, k_proj=kv, v_proj=kv, o_proj=hidden, gate_proj=inter, up_proj=inter, down_proj=hidden)


def _pair(
    tensors: dict[str, torch.Tensor], name: str, in_features: int, out_features: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This projection's (A [rank, in], B [out, rank]) zero-padded to ``rank``; zeros where the task
    does not adapt it."""
    a, b = tensors.get(f"{name}.lora_A.weight"), tensors.get(f"{name}.lora_B.weight")
    if a is None and b is None:
        return torch.zeros(rank, in_features), torch.zeros(out_features, rank)
    if a is None or b is None or a.shape[1] != in_features or b.shape != (out_features, a.shape[0]):
        raise ConfigError(
            f"task adapter {name}: lora_A / lora_B missing or not [r, {in_features}] / [{out_features}, r]"
        )
    r = a.shape[0]
    return nn.functional.pad(a.float(), (0, 0, 0, rank - r)), nn.functional.pad(b.float(), (0, rank - r))


def _read_adapter(path: Path, layers: int) -> tuple[int, float, dict[str, torch.Tensor]]:
    """(rank, scale, tensors by the projection's checkpoint name + .lora_A/B.weight) of one PEFT adapter
    of a model of ``layers`` layers."""
    config_path, weights_path = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise ConfigError(f"task adapter folder {path} lacks adapter_config.json or adapter_model.safetensors")
    config = json.loads(config_path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{config_path}: peft_type {config.get('peft_type')!r} is not supported (LORA only)")
    for flag in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"):
        if config.get(flag):
            raise ConfigError(f"{config_path}: {flag} is not supported")
    if config.get("bias", "none") != "none":
        raise ConfigError(f"{config_path}: bias {config.get('bias')!r} is not supported (none only)")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):  # PEFT's shorthand for every linear layer, or a pattern (refused)
        targets = sorted(_TARGETS) if targets == "all-linear" else [targets]
    if unknown := sorted(set(targets) - _TARGETS):
        raise ConfigError(f"{config_path}: target_modules {unknown} are not supported (supported: {sorted(_TARGETS)})")
    r, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    tensors = {}
    for key, tensor in load_file(str(weights_path)).items():
        prefix = next((p for p in _PEFT_PREFIXES if key.startswith(p)), "")
        name = key[len(prefix) :]
        if not prefix or not _LORA_KEY.fullmatch(name) or int(name.split(".")[1]) >= layers:
            raise ConfigError(f"{weights_path}: tensor {key!r} is no LoRA pair of this model's projections")
        tensors[name] = tensor
    return r, scale, tensors
