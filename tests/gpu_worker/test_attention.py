"""SDPA over packed sequences: the padded one-call path equals attention sequence by sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from services.gpu_worker.engine.attention import SdpaVarlen


def per_sequence(q, k, v, lengths):
    out, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        o = F.scaled_dot_product_attention(*(t[sl].transpose(0, 1)[None] for t in (q, k, v)))
        out.append(o[0].transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("lengths, padded", [
    ([3, 7, 5, 6, 1, 7], True),  # many short sequences of different lengths: one padded call
    ([16, 16, 16], False),  # one run of equal lengths: a view, no padding
    ([2, 40, 3], False),  # padding would more than double the tokens: call by call
])
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


@pytest.mark.parametrize("lengths, padded", [
    ([18, 6], False),  # one query and the dummy row that rounds a CPU batch up to 24 tokens
    ([3, 7, 5, 6, 1, 2], True),  # many queries, then the dummy row: one padded call
])
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
