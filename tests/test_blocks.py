"""Norms equal torch's; blocks run both ways; counting formulas match counted models."""
import pytest
import torch
from hypothesis import given, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from attnlab.blocks import (
    FeedForward, LayerNorm, RMSNorm, TransformerBlock, approx_transformer_parameters, block_flops,
    count_parameters,
)


@given(st.integers(1, 4), st.integers(1, 9), st.integers(2, 40), st.integers(0, 999))
def test_norms_equal_torch(b, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, d, generator=g) * 3 + 1
    ours, theirs = LayerNorm(d), torch.nn.LayerNorm(d)
    with torch.no_grad():
        for p in (ours.weight, theirs.weight, ours.bias, theirs.bias):
            p.copy_(torch.randn(d, generator=torch.Generator().manual_seed(seed + 1)))
    assert torch.allclose(ours(x), theirs(x), atol=1e-5)
    rms, torch_rms = RMSNorm(d), torch.nn.RMSNorm(d, eps=1e-6)
    assert torch.allclose(rms(x), torch_rms(x), atol=1e-5)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_block_shapes_and_causality(norm_position, norm):
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, norm_position=norm_position, norm=norm).eval()
    x = torch.randn(2, 7, 16)
    y = block(x, causal=True)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 2, 16)
    assert torch.allclose(block(x2, causal=True)[:, :5], y[:, :5], atol=1e-6)


def test_block_rejects_bad_options():
    with pytest.raises(ValueError, match="norm_position"):
        TransformerBlock(8, 2, norm_position="middle")
    with pytest.raises(ValueError, match="norm must be"):
        TransformerBlock(8, 2, norm="batch")
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, activation="tanh")


def test_block_parameter_count_is_12_d_squared_plus_small_terms():
    d = 64
    block = TransformerBlock(d, 4)
    # 4d² + 4d attention, 8d² + 5d feed-forward (d_ff = 4d), 4d for two LayerNorms
    assert count_parameters(block) == 12 * d * d + 13 * d
    assert approx_transformer_parameters(2, d, vocab=100, n_ctx=10) == 24 * d * d + 110 * d


def test_block_flops_formula_matches_flop_counter():
    n, d = 64, 32
    block = TransformerBlock(d, 4, bias=False)
    with FlopCounterMode(display=False) as counter:
        block(torch.randn(1, n, d))
    assert counter.get_total_flops() == block_flops(n, d)["total"] == 24 * n * d * d + 4 * n * n * d
