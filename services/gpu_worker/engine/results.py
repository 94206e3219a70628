"""Lazy results: ``Engine.step`` returns at once; the vectors are read when the device is done."""

from __future__ import annotations

import numpy as np
import torch


class ReadyResult:
    """CPU: computed synchronously, ready at once."""

    def __init__(self, vectors: np.ndarray | dict[str, np.ndarray], run: str = "eager") -> None:
        self._vectors = vectors
        self.run = run  # how the forward ran: "eager", "captured" (eager, then a graph captured) or "replay"

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    def result(self) -> np.ndarray | dict[str, np.ndarray]:
        return self._vectors


class CudaResult:
    """A pinned host buffer filled by an async device-to-host copy, and the event that marks it done."""

    def __init__(
        self, host: torch.Tensor | dict[str, torch.Tensor], event: torch.cuda.Event, run: str = "eager"
    ) -> None:
        self._host = host  # [B, H] float32, pinned (or several such outputs by name)
        self._event = event
        self.run = run  # as ReadyResult.run

    def ready(self) -> bool:
        return self._event.query()

    def wait(self) -> None:
        self._event.synchronize()

    def result(self) -> np.ndarray | dict[str, np.ndarray]:
        self._event.synchronize()
        if isinstance(self._host, dict):
            return {k: v.numpy() for k, v in self._host.items()}
        return self._host.numpy()
