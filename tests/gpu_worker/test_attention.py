"""SDPA over packed sequences: the padded one-call path equals attention sequence by sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedfleet.services.gpu_worker.engine.attention import SdpaVarlen


def per_sequence(q, k, v, lengths):
    out, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        o = F.scaled_dot_product_attention(*(t[sl].transpose(0, 1)[None] for t in (q, k, v)))
        out.append(o[0].transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize(
    "lengths, padded",
    [
        ([3, 7, 5, 6, 1, 7], True),  # many short sequences of different lengths: one padded call
        ([16, 16, 16], False),  # one run of equal lengths: a view, no padding
        ([2, 40, 3], False),  # padding would more than double the tokens: call by call
    ],
)
def test_padded_and_run_paths_equal_attention_per_sequence(lengths, padded):
    torch.manual_seed(0)
    total, heads, d = sum(lengths), 4, 32
    q, k, v = (torch.randn(total, heads, d) for _ in range(3))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    attention = SdpaVarlen()
    attention.bind(cu, torch.from_numpy(cu), max(lengths))
    assert (attention._pad is not None) == padded
    torch.testing.assert_close(attention(q, k, v), per_sequence(q, k, v, lengths), atol=1e-5, rtol=1e-5)


def test_empty_sequences_are_skipped():
    lengths = [4, 0, 6, 2, 0, 5]
    torch.manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), 2, 32) for _ in range(3))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    attention = SdpaVarlen()
    attention.bind(cu, torch.from_numpy(cu), max(lengths))
    expected = per_sequence(q, k, v, [n for n in lengths if n])
    torch.testing.assert_close(attention(q, k, v), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "lengths, padded",
    [
        ([18, 6], False),  # one query and the dummy row that rounds a CPU batch up to 24 tokens
        ([3, 7, 5, 6, 1, 2], True),  # many queries, then the dummy row: one padded call
    ],
)
def test_padding_tokens_are_not_attended_and_get_zeros(lengths, padded):
    """Tokens from real_tokens on (a CPU batch's dummy row) are skipped: the others' outputs are those
    of attention per sequence, the dummy's are zeros (never read, but finite)."""
    torch.manual_seed(2)
    total, real = sum(lengths), sum(lengths[:-1])
    q, k, v = (torch.randn(total, 4, 32) for _ in range(3))
    cu = np.concatenate([[0], np.cumsum(lengths), [total, total]]).astype(np.int32)  # zero-length rows after
    attention = SdpaVarlen()
    attention.bind(cu, torch.from_numpy(cu), max(lengths), real_tokens=real)
    assert (attention._pad is not None) == padded
    out = attention(q, k, v)
    assert out.shape == q.shape
    torch.testing.assert_close(out[:real], per_sequence(q, k, v, lengths[:-1]), atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(out[real:]) == 0


def dense_reference(q, k, v, lengths, mask):
    """Attention sequence by sequence with the AttnMask written out in full ([L, L] scores)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        qs, ks, vs = (t[sl].transpose(0, 1) for t in (q, k, v))  # [heads, L, d]
        scores = qs @ ks.transpose(-1, -2) * (mask.scale or q.shape[-1] ** -0.5)
        if mask.softcap is not None:
            scores = mask.softcap * torch.tanh(scores / mask.softcap)
        i = torch.arange(n)
        rel = i[None, :] - i[:, None]
        allowed = torch.ones(n, n, dtype=torch.bool)
        if mask.causal:
            allowed &= rel <= 0
        if mask.window is not None:
            allowed &= rel.abs() <= mask.window
        if mask.bias is not None:
            scores = scores + mask.bias(n)
        out.append((scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


def _masks():
    from embedfleet.services.gpu_worker.engine.attention import AttnMask

    torch.manual_seed(3)
    table = torch.randn(9, 4)

    def bias(n: int) -> torch.Tensor:  # depends on j - i only, like MPNet's buckets
        i = torch.arange(n)
        return table[(i[None, :] - i[:, None]).clamp(-4, 4) + 4].permute(2, 0, 1)

    return {
        "causal": AttnMask(causal=True),
        "causal-window": AttnMask(causal=True, window=3),
        "symmetric-window": AttnMask(window=2),
        "scaled": AttnMask(scale=0.3),
        "bias": AttnMask(bias=bias),
        # Gemma2's: scores past the cap (1.5 bends these N(0, 1) products' scores) flattened by tanh
        "softcap-causal-window": AttnMask(causal=True, window=3, scale=0.3, softcap=1.5),
    }


@pytest.mark.parametrize(
    "mask_name", ["causal", "causal-window", "symmetric-window", "scaled", "bias", "softcap-causal-window"]
)
@pytest.mark.parametrize(
    "lengths, padded",
    [
        ([3, 7, 5, 6, 1, 7], True),  # one padded call
        ([9, 9, 9], False),  # one run of equal lengths
        ([2, 40, 3], False),  # call by call
    ],
)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_masks_on_every_path_equal_dense_attention(mask_name, lengths, padded, kv_heads):
    """Causal, windowed, scaled and biased attention, with grouped-query heads, on the padded, run
    and per-sequence paths, against the mask written out in full."""
    mask = _masks()[mask_name]
    torch.manual_seed(4)
    total = sum(lengths)
    q = torch.randn(total, 4, 16)
    k, v = torch.randn(total, kv_heads, 16), torch.randn(total, kv_heads, 16)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    attention = SdpaVarlen()
    attention.bind(cu, torch.from_numpy(cu), max(lengths))
    assert (attention._pad is not None) == padded
    torch.testing.assert_close(attention(q, k, v, mask), dense_reference(q, k, v, lengths, mask), atol=1e-5, rtol=1e-5)
