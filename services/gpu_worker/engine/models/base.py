"""What every model family provides to the engine and the loader."""

from __future__ import annotations

import abc
from pathlib import Path

import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.attention import Attention, AttnMask
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.spec import ModelSpec


class EncoderModel(nn.Module, abc.ABC):
    """A packed forward: token ids [T] (plus positions, segment ids) -> hidden states [T, hidden].

    Subclasses set ``PREFIXES`` (the checkpoint name prefixes the family's base model is saved under,
    e.g. "model." inside a ``…ForSequenceClassification``) and ``PROBE`` (a tensor every checkpoint
    of the family has, without prefix), and build ``head`` for sequence classifiers.
    """

    PREFIXES: tuple[str, ...] = ("",)
    PROBE: str = ""
    USES_TOKEN_TYPES = False  # segment ids (pairs) change the output: BERT only; others ignore them
    # the task adapters the checkpoint has, in the order ``batch.adapters`` numbers them from 1 (layers/lora.py)
    adapter_names: tuple[str, ...] = ()
    layers: nn.ModuleList  # the transformer layers, in order: each family builds its own

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.head: nn.Module | None = None
        # a two-tower model's image tower (CLIP): pixels [N, C, S, S] -> vectors [N, dim]; None for text models
        self.vision: nn.Module | None = None

    @abc.abstractmethod
    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor: ...

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """The pooled vectors [R, hidden] float32 as the model outputs them (CLIP projects them; most as they are)."""
        return pooled

    @abc.abstractmethod
    def layer_masks(self) -> list[AttnMask]:
        """Each layer's attention mask, in order."""

    def masks(self) -> tuple[AttnMask, ...]:
        """Every distinct attention mask the layers use (the attention backend must serve them all)."""
        return tuple(dict.fromkeys(self.layer_masks()))

    @abc.abstractmethod
    def weight_names(self) -> dict[str, list[str]]:
        """Our parameter name -> the checkpoint names (after the prefix) it is made of (several: concatenated)."""

    def load_adapters(self, folder: Path) -> None:
        """Read task adapters kept beside the checkpoint (jina-embeddings-v5's ``adapters/<task>/``), after
        the weights; most families keep theirs in the checkpoint or have none."""

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        """The checkpoint tensor (concatenated where ``weight_names`` lists several) laid out as our
        parameter ``ours`` holds it (as it is here; GTE swaps its [up; gate] rows)."""
        return tensor

    def head_names(self) -> dict[str, list[str]]:
        """Our head parameter -> the absolute checkpoint names it may have (the first found is taken)."""
        return {}

    def head_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        """The part of the checkpoint tensor found for head parameter ``ours`` that it holds (all of it here)."""
        return tensor

    def scorer(self) -> nn.Module:
        """``head``: a classifier's checkpoint has one (``score`` is called only then)."""
        assert self.head is not None, "scored with a model that has no classification head"
        return self.head

    @abc.abstractmethod
    def score(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        """A classifier's logits [R, labels] float32 from the hidden states [T, hidden] (called only when
        the checkpoint has a head)."""
