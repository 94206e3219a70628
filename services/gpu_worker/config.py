"""Worker configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import ConfigError, NatsConfig, add_option, nats_config, positive_int
from shared.model_dir import ModelInfo, load_model_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--device", "EMBEDFLEET_DEVICE", "auto", "torch device: auto (CUDA when present), cpu, cuda, cuda:N")
    add_option(parser, "--dtype", "EMBEDFLEET_DTYPE", None, "compute dtype (default: float32 on CPU, float16 on CUDA)",
               choices=("float32", "float16", "bfloat16"))
    add_option(parser, "--max-batch-tokens", "EMBEDFLEET_MAX_BATCH_TOKENS", 2048, "token budget of one engine batch", positive_int)
    add_option(parser, "--max-batch-seqs", "EMBEDFLEET_MAX_BATCH_SEQS", 256, "max sequences in one engine batch", positive_int)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    nats: NatsConfig
    model: ModelInfo
    device: str
    dtype: str | None
    max_batch_tokens: int
    max_batch_seqs: int

    def __post_init__(self) -> None:
        if self.max_batch_tokens < self.model.max_seq_length:
            raise ConfigError(
                f"--max-batch-tokens {self.max_batch_tokens} is below the model's sequence limit {self.model.max_seq_length}"
            )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> WorkerConfig:
        return cls(
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            device=ns.device,
            dtype=ns.dtype,
            max_batch_tokens=ns.max_batch_tokens,
            max_batch_seqs=ns.max_batch_seqs,
        )
