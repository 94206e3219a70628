"""``embedfleet check MODEL_DIR``: will this folder serve, and how — before deploying it.

Reads what the tokenizer and the worker read at start (configs, tokenizer, the checkpoint's tensor
names; no weights are loaded), and says the family, attention, pooling, dimensions, limit, prompts
and the attention backend per device; or the first thing that stops the folder from serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info

if TYPE_CHECKING:
    from embedfleet.services.tokenizer.encoder import TextEncoder


@dataclass
class Report:
    folder: str
    ok: bool = True
    error: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"{self.folder}: {'serves' if self.ok else 'cannot serve'}"]
        lines += [f"  {key:<20} {value}" for key, value in self.facts.items()]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def check_folder(folder: str) -> Report:
    report = Report(folder)
    try:
        _check(folder, report)
    except ConfigError as exc:
        report.ok, report.error = False, str(exc)
    return report


def _check(folder: str, report: Report) -> None:
    import torch

    from embedfleet.services.gpu_worker.engine.attention import FLASHINFER_HEAD_DIMS, FlashInferRagged, TorchFlashVarlen
    from embedfleet.services.gpu_worker.engine.models.registry import family_for, spec_from_folder
    from embedfleet.services.tokenizer.encoder import TextEncoder

    info = load_model_info(folder)
    spec = spec_from_folder(info)
    family = family_for(spec.config)
    facts = report.facts
    facts["family"] = f"{family.name} (model_type {spec.model_type})"
    facts["task"] = f"classifier, {info.dim} logit(s)" if info.scores else "embeddings"
    facts["shape"] = (
        f"{spec.num_layers} layers, hidden {spec.hidden_size}, {spec.num_heads} heads"
        f"{f' / {spec.kv_heads} kv' if spec.kv_heads != spec.num_heads else ''}, head size {spec.head_dim}"
    )
    with torch.device("meta"):  # the layers' shapes and masks, no memory
        model = family.model(spec)
    facts["attention"] = "; ".join(m.describe() for m in model.masks())
    _check_tensors(info.path, model)
    facts["max tokens"] = min(info.max_seq_length, spec.max_positions - spec.position_offset)
    if not info.scores:
        stack = [f"pooling {info.pooling}{'' if info.include_prompt else ' (prompt tokens skipped)'}"] + [
            f"dense {d.in_features}->{d.out_features} ({d.activation})" for d in info.dense
        ]
        stack += ["normalize"] if info.normalize else []
        facts["output"] = " -> ".join(stack)
        facts["dimensions"] = (
            info.dim if info.truncate_dim is None else f"{info.dim} (Matryoshka default {info.truncate_dim})"
        )
        prompts = ", ".join(f"{k}={v!r}" for k, v in info.prompts.items() if v) or "none"
        facts["prompts"] = prompts + (f" (default {info.default_prompt})" if info.default_prompt else "")
    encoder = TextEncoder(info)
    if info.score_tokens:
        _describe_llm_reranker(info, encoder, facts)
    facts["tokenizer"] = f"vocab {spec.vocab_size}, 'hello' -> {encoder.encode(['hello'])[0]}"
    facts["dtype"] = "cpu float32; cuda " + (
        "float32 (float16 overflows; bfloat16 on request)" if family.fp16_overflows else "float16"
    )
    facts["backend (cpu)"] = "sdpa (eager)"
    masks, grouped = model.masks(), spec.kv_heads != spec.num_heads
    if spec.head_dim in FLASHINFER_HEAD_DIMS and all(FlashInferRagged.supports(m) for m in masks):
        cuda = "flashinfer where installed, else torch-flash-varlen; CUDA graphs"
    elif _varlen_supports(TorchFlashVarlen, masks, grouped):
        cuda = "torch-flash-varlen; CUDA graphs"
    else:
        cuda = "sdpa (eager, no CUDA graphs: a score bias or a window this PyTorch's kernels cannot take)"
    facts["backend (cuda)"] = cuda


def _describe_llm_reranker(info: ModelInfo, encoder: TextEncoder, facts: dict[str, Any]) -> None:
    """What an LLM reranker scores and how its pairs reach the model."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(info.path / "tokenizer.json"))
    true, *false = (f"logit[{vocab.id_to_token(t)!r} ({t})]" for t in info.score_tokens)
    activation = "sigmoid" if info.score_activation == "sigmoid" else "no activation"
    facts["task"] = (
        f"LLM reranker: {true}{f' - {false[0]}' if false else ''} at the last token, {activation} by default"
    )
    if info.pair_template is None:
        facts["pairs"] = "tokenizer pair (no chat template)"
    else:
        facts["pairs"] = (
            f"chat template ({info.message_format} messages: query, document), "
            f"{encoder.pair_overhead()} tokens besides them"
        )
        facts["after the document"] = repr(vocab.decode(encoder.pair_tail, skip_special_tokens=False))
    facts["prompt"] = repr(encoder.pair_prompt) + (f" ({info.default_prompt})" if encoder.pair_prompt else " (none)")


def _varlen_supports(cls, masks, grouped: bool) -> bool:
    try:
        flash = cls()
    except ImportError:
        return False
    return all(flash.supports(m, grouped) for m in masks)


def _check_tensors(path: Path, model) -> None:
    """Every tensor the family maps is in the checkpoint (names only; nothing is loaded)."""
    from embedfleet.services.gpu_worker.engine.loader import safetensors_files

    files = safetensors_files(path)
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    prefix = next((p for p in model.PREFIXES if f"{p}{model.PROBE}" in names), None)
    if prefix is None:
        raise ConfigError(f"checkpoint has no {model.PROBE!r}: not a {model.spec.family} model")
    for theirs in model.weight_names().values():
        for name in theirs:
            if prefix + name not in names and not _legacy(prefix + name, names):
                raise ConfigError(f"checkpoint is missing tensor {prefix + name!r}")
    for candidates in model.head_names().values():
        if not any(n in names for n in candidates):
            raise ConfigError(f"classifier checkpoint has none of {candidates}")


def _legacy(name: str, names: set[str]) -> bool:
    return (name.endswith(".LayerNorm.weight") and name[: -len("weight")] + "gamma" in names) or (
        name.endswith(".LayerNorm.bias") and name[: -len("bias")] + "beta" in names
    )


def main(folders: list[str], as_json: bool) -> int:
    reports = [check_folder(f) for f in folders]
    if as_json:
        print(json.dumps([r.__dict__ for r in reports], indent=2, default=str))
    else:
        print("\n\n".join(r.render() for r in reports))
    return 0 if all(r.ok for r in reports) else 1
