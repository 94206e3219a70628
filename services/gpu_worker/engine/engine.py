"""Engine: packed token batches in, one pooled vector per sequence out."""

from __future__ import annotations

import logging

import numpy as np
import torch

from shared.errors import ErrorCode, ServiceError
from shared.model_dir import ModelInfo
from services.gpu_worker.engine.attention import SdpaVarlen
from services.gpu_worker.engine.bert import BertEncoder
from services.gpu_worker.engine.loader import load_weights, read_safetensors
from services.gpu_worker.engine.pooling import pool
from services.gpu_worker.engine.spec import ModelSpec

log = logging.getLogger("embedfleet.engine")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(requested: str | None) -> torch.device:
    if requested in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ServiceError(ErrorCode.INTERNAL, f"device {requested!r} asked for, but CUDA is not available")
    return device


class Engine:
    """One model replica on one device. Not thread-safe: one forward at a time."""

    def __init__(self, info: ModelInfo, device: str | None = None, dtype: str | None = None) -> None:
        self.info = info
        self.spec = ModelSpec.from_folder(info.path)
        self.device = pick_device(device)
        if dtype is None:
            # CPU matmuls in half precision are slow and lossy; GPUs are built for them
            dtype = "float16" if self.device.type == "cuda" else "float32"
        self.dtype = DTYPES[dtype]
        if info.dim != self.spec.hidden_size:
            raise ServiceError(ErrorCode.INTERNAL, f"pooling dimension {info.dim} != hidden size {self.spec.hidden_size}")
        model = BertEncoder(self.spec)
        load_weights(model, read_safetensors(info.path))
        self.model = model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        # longest sequence the position table allows
        self.max_seq_length = min(info.max_seq_length, self.spec.max_positions - self.spec.position_offset)
        log.info(
            "engine: %s (%s, %d layers, hidden %d) on %s in %s",
            info.id, self.spec.model_type, self.spec.num_layers, self.spec.hidden_size, self.device, dtype,
        )

    @property
    def dim(self) -> int:
        return self.spec.hidden_size

    def check(self, input_ids: np.ndarray, cu_seqlens: np.ndarray) -> None:
        """Reject token batches the model cannot take (ids outside the vocabulary, over-long rows)."""
        if len(input_ids) and (input_ids.min() < 0 or input_ids.max() >= self.spec.vocab_size):
            raise ServiceError(ErrorCode.INVALID_TOKENS, f"token ids must be in [0, {self.spec.vocab_size})")
        longest = int(np.diff(cu_seqlens).max(initial=0))
        if longest > self.max_seq_length:
            raise ServiceError(
                ErrorCode.INPUT_TOO_LONG, f"a sequence has {longest} tokens; the model's limit is {self.max_seq_length}"
            )

    @torch.inference_mode()
    def embed(self, input_ids: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
        """input_ids [T] int32, cu_seqlens [B + 1] int32 -> pooled vectors [B, hidden] float32.

        Inputs must have passed :meth:`check`.
        """
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        lengths = np.diff(cu)
        # position of each token inside its own sequence: [T]
        positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], lengths) + self.spec.position_offset
        dev = self.device
        ids_t = torch.from_numpy(np.asarray(input_ids, dtype=np.int64)).to(dev, non_blocking=True)
        pos_t = torch.from_numpy(positions).to(dev, non_blocking=True)
        types_t = torch.zeros_like(ids_t)
        hidden = self.model(ids_t, pos_t, types_t, SdpaVarlen(cu.tolist()))
        pooled = pool(hidden, torch.from_numpy(cu).to(dev), torch.from_numpy(lengths).to(dev), self.info.pooling)
        return pooled.float().cpu().numpy()
