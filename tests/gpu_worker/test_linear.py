"""The CPU's fused linear kernels: small GEMMs take the plain path, larger ones oneDNN's; both agree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedfleet.services.gpu_worker.engine.linear import LinearOps, OneDnnLinearOps, select_linear_ops

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


@pytest.fixture(scope="module")
def ops() -> OneDnnLinearOps:
    ops = select_linear_ops(torch.device("cpu"), torch.float32)
    assert (
        isinstance(ops, OneDnnLinearOps) and ops.small_macs == OneDnnLinearOps.SMALL_MACS
    )  # the self-check's own instance took 0
    return ops


def _calls(ops: LinearOps, x: torch.Tensor, layer: nn.Linear, residual: torch.Tensor) -> list[torch.Tensor]:
    return [
        ops.linear(x, layer),
        ops.linear_act(x, layer, "gelu"),
        ops.linear_add(x, layer, residual),
        ops.gated(x, layer, "silu"),
    ]


@pytest.mark.parametrize("tokens", [1, 17, 300])
def test_small_gemms_are_the_plain_ones_and_large_ones_agree(ops: OneDnnLinearOps, tokens: int):
    gen = torch.Generator().manual_seed(tokens)
    layer = nn.Linear(64, 128).requires_grad_(False)  # 8,192 multiply-adds a token: 256 tokens reach the threshold
    x, residual = torch.randn(tokens, 64, generator=gen), torch.randn(tokens, 128, generator=gen)
    small = tokens * 64 * 128 < OneDnnLinearOps.SMALL_MACS
    with torch.inference_mode():
        for got, want in zip(_calls(ops, x, layer, residual), _calls(LinearOps(), x, layer, residual)):
            if small:
                assert torch.equal(got, want)  # the same kernel
            else:
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
