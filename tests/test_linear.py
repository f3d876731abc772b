"""Linear attention: parallel = recurrent = chunked; GLA recurrent = chunked; FAVOR+ approaches softmax."""
import pytest
import torch
from hypothesis import given, strategies as st

from attnlab.attention import scaled_dot_product_attention
from attnlab.linear import gated_linear_attention, linear_attention, orthogonal_gaussian


def _qkv(n, d=8, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) * scale for _ in range(3))


@given(st.integers(1, 50), st.integers(1, 17), st.sampled_from(["elu", "relu"]), st.integers(0, 999))
def test_three_forms_are_equal(n, chunk, feature_map, seed):
    q, k, v = _qkv(n, seed=seed)
    parallel = linear_attention(q, k, v, feature_map=feature_map, causal=True)
    for method in ("recurrent", "chunked"):
        other = linear_attention(q, k, v, feature_map=feature_map, causal=True, method=method, chunk=chunk)
        assert torch.allclose(parallel, other, atol=1e-12)


def test_non_causal_equals_explicit_kernel_attention():
    q, k, v = _qkv(9)
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    scores = fq @ fk.transpose(-2, -1)
    expected = scores @ v / scores.sum(-1, keepdim=True)
    assert torch.allclose(linear_attention(q, k, v), expected, atol=1e-12)


def test_favor_error_falls_with_features():
    q, k, v = _qkv(64, d=16, seed=3, scale=0.5)
    exact = scaled_dot_product_attention(q, k, v)
    errors = []
    for m in (16, 256, 4096):
        out = linear_attention(q, k, v, feature_map="favor", omega=orthogonal_gaussian(m, 16, seed=1, dtype=torch.float64))
        errors.append(((out - exact).norm() / exact.norm()).item())
    assert errors[2] < errors[0] / 3


@given(st.integers(1, 40), st.integers(1, 12), st.integers(0, 999))
def test_gla_chunked_equals_recurrent(n, chunk, seed):
    q, k, v = _qkv(n, seed=seed)
    log_decay = -torch.rand(2, 3, n, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    rec = gated_linear_attention(q, k, v, log_decay)
    chunked = gated_linear_attention(q, k, v, log_decay, method="chunked", chunk=chunk)
    assert torch.allclose(rec, chunked, atol=1e-10)


def test_gla_without_decay_is_unnormalised_causal_linear_attention():
    q, k, v = _qkv(12)
    out = gated_linear_attention(q, k, v, torch.zeros_like(k))
    assert torch.allclose(out, (q @ k.transpose(-2, -1)).tril() @ v, atol=1e-12)


def test_bad_input():
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match="method must be one of"):
        linear_attention(q, k, v, method="fast")
    with pytest.raises(ValueError, match="needs omega"):
        linear_attention(q, k, v, feature_map="favor")
    with pytest.raises(ValueError, match="feature_map must be"):
        linear_attention(q, k, v, feature_map="tanh")
    with pytest.raises(ValueError, match="same b, h, n"):
        linear_attention(q, k[..., :4, :], v)
    with pytest.raises(ValueError, match="be <= 0"):
        gated_linear_attention(q, k, v, torch.ones_like(k))
