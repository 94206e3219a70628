"""Tokenizer service configuration, built once from CLI flags and EMBEDFLEET_* variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import NatsConfig, add_option, nats_config, positive_int
from shared.model_dir import ModelInfo, load_model_info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--chunk-tokens", "EMBEDFLEET_CHUNK_TOKENS", 8192, "max tokens per batch sent to a worker", positive_int)
    add_option(parser, "--chunk-seqs", "EMBEDFLEET_CHUNK_SEQS", 256, "max sequences per batch sent to a worker", positive_int)


@dataclass(frozen=True, slots=True)
class TokenizerConfig:
    nats: NatsConfig
    model: ModelInfo
    chunk_tokens: int
    chunk_seqs: int

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> TokenizerConfig:
        return cls(
            nats=nats_config(ns),
            model=load_model_info(ns.model, ns.model_name),
            chunk_tokens=ns.chunk_tokens,
            chunk_seqs=ns.chunk_seqs,
        )
