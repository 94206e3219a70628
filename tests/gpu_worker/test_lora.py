"""Task adapters applied per token of one packed batch (layers/lora.py) equal each row run alone
through its adapter merged into the weights (W + scale * B @ A), tasks mixed in one batch."""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.services.gpu_worker.engine.batch import prepare
from embedfleet.services.gpu_worker.engine.layers.lora import (
    EmbeddingAdapters,
    LinearAdapters,
    adapter_mask,
    stack_embedding,
    stack_linear,
)

COUNT, RANK, SCALE = 3, 4, 0.25


def test_linear_adapters_per_row_equal_merged_weights():
    gen = torch.Generator().manual_seed(0)
    base = torch.nn.Linear(16, 24)
    a = [torch.randn(RANK, 16, generator=gen) for _ in range(COUNT)]
    b = [torch.randn(24, RANK, generator=gen) for _ in range(COUNT)]
    layer = LinearAdapters(16, 24, COUNT, RANK)
    stacked_a, stacked_b = stack_linear(a, b, SCALE)
    layer.a.data.copy_(stacked_a)
    layer.b.data.copy_(stacked_b)
    x = torch.randn(10, 16, generator=gen)
    adapters = torch.tensor([0, 1, 2, 3, 1, 0, 3, 3, 2, 1])  # every adapter and none, interleaved
    got = base(x) + layer(x, adapter_mask(adapters, COUNT, RANK, x.dtype))
    for t in range(10):
        i = int(adapters[t])
        weight = base.weight if i == 0 else base.weight + SCALE * b[i - 1] @ a[i - 1]
        want = torch.nn.functional.linear(x[t], weight, base.bias)
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


def test_embedding_adapters_per_row_equal_merged_table():
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(50, 8, generator=gen)
    a = [torch.randn(50, RANK, generator=gen) for _ in range(COUNT)]
    b = [torch.randn(RANK, 8, generator=gen) for _ in range(COUNT)]
    layer = EmbeddingAdapters(50, 8, COUNT, RANK)
    stacked_a, stacked_b = stack_embedding(a, b, SCALE)
    layer.a.data.copy_(stacked_a)
    layer.b.data.copy_(stacked_b)
    ids = torch.tensor([3, 7, 7, 49, 0, 12])
    adapters = torch.tensor([2, 0, 1, 3, 3, 1])
    got = table[ids] + layer(ids, adapter_mask(adapters, COUNT, RANK, table.dtype))
    for t in range(len(ids)):
        i = int(adapters[t])
        merged = table if i == 0 else table + SCALE * a[i - 1] @ b[i - 1]
        torch.testing.assert_close(got[t], merged[ids[t]], rtol=1e-5, atol=1e-5)


def test_prepare_gives_each_token_its_rows_adapter_and_pads_with_none():
    cu = np.array([0, 3, 5, 9], dtype=np.int32)
    host = prepare(np.arange(9), cu, 0, pad_to=12, rows_to=5, adapters=np.array([2, 0, 1]))
    assert host.adapters.tolist() == [2, 2, 2, 0, 0, 1, 1, 1, 1, 0, 0, 0]
    assert prepare(np.arange(9), cu, 0).adapters.tolist() == [0] * 9
