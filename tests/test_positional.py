"""Positional encodings: sinusoidal shifts are rotations, RoPE is relative, ALiBi's slopes."""
import math

import pytest
import torch
from hypothesis import given, strategies as st

from attnlab.positional import (
    LearnedPositionalEmbedding, alibi_bias, alibi_slopes, apply_rope, apply_rope_complex,
    frequencies, shift_matrix, sinusoidal_encoding,
)


@pytest.mark.parametrize("d", [1, 7, 16])
def test_sinusoidal_values_and_odd_width(d):
    pe = sinusoidal_encoding(11, d)
    assert pe.shape == (11, d)
    assert pe[5, 0].item() == pytest.approx(math.sin(5))
    if d > 1:
        assert pe[5, 1].item() == pytest.approx(math.cos(5))
    if d >= 4:
        assert pe[3, 2].item() == pytest.approx(math.sin(3 / 10000 ** (2 / d)))
    with pytest.raises(ValueError, match="d >= 1"):
        sinusoidal_encoding(3, 0)


def test_symbol_test_value():
    assert sinusoidal_encoding(11, 512, dtype=torch.float64)[10, 6].item() == pytest.approx(0.43308, abs=1e-5)


@given(st.integers(1, 16).map(lambda h: 2 * h), st.integers(-50, 50), st.sampled_from([100.0, 10000.0]))
def test_shift_is_a_rotation(d, k, base):
    pe = sinusoidal_encoding(120, d, base, dtype=torch.float64)
    m = shift_matrix(k, d, base)
    p = torch.arange(max(0, -k), min(120, 120 - k))
    assert torch.allclose(pe[p + k], pe[p] @ m.T, atol=1e-12)
    assert torch.allclose(m @ m.T, torch.eye(d, dtype=torch.float64), atol=1e-12)


def test_shift_matrix_needs_even_width_and_dot_products_depend_on_offset_only():
    with pytest.raises(ValueError, match="even d"):
        shift_matrix(1, 5)
    pe = sinusoidal_encoding(64, 32, dtype=torch.float64)
    gram = pe @ pe.T
    for k in range(10):
        assert torch.allclose(gram.diagonal(k), gram.diagonal(k)[0].expand(64 - k), atol=1e-12)
    assert torch.allclose(frequencies(8), torch.tensor([1, 10 ** -1, 10 ** -2, 10 ** -3], dtype=torch.float64))


def test_learned_embedding_refuses_to_extrapolate():
    emb = LearnedPositionalEmbedding(8, 4)
    assert emb(torch.zeros(2, 5, 4)).shape == (2, 5, 4)
    with pytest.raises(ValueError, match="max_len=8"):
        emb(torch.zeros(1, 9, 4))


@given(st.integers(1, 12).map(lambda h: 2 * h), st.integers(1, 20), st.integers(-30, 30), st.integers(0, 1000))
def test_rope_score_depends_only_on_offset(d, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, n, d, generator=g, dtype=torch.float64)
    pos = torch.arange(n, dtype=torch.float64)
    scores = apply_rope(q, pos) @ apply_rope(k, pos).T
    shifted = apply_rope(q, pos + shift) @ apply_rope(k, pos + shift).T
    assert torch.allclose(scores, shifted, atol=1e-9)
    assert torch.allclose(apply_rope(q, pos), apply_rope_complex(q, pos), atol=1e-12)
    assert torch.allclose(apply_rope(q).norm(dim=-1), q.norm(dim=-1))          # a rotation


def test_rope_complex_formula_needs_the_conjugate():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, dtype=torch.float64, generator=g)
    m, n = 7, 3
    score = apply_rope(q.view(1, 8), [m]) @ apply_rope(k.view(1, 8), [n]).T
    zq, zk = torch.view_as_complex(q.view(4, 2)), torch.view_as_complex(k.view(4, 2))
    phase = torch.exp(1j * (m - n) * frequencies(8))
    assert score.item() == pytest.approx((zq * zk.conj() * phase).sum().real.item())
    assert score.item() != pytest.approx((zq * zk * phase).sum().real.item())


def test_rope_rejects_odd_width_and_bad_positions():
    with pytest.raises(ValueError, match="d even"):
        apply_rope(torch.randn(3, 5))
    with pytest.raises(ValueError, match="one entry per row"):
        apply_rope(torch.randn(3, 4), positions=[0, 1])


def test_alibi():
    assert torch.allclose(alibi_slopes(8), 2.0 ** -torch.arange(1, 9))
    assert len(alibi_slopes(12)) == 12 and len(set(alibi_slopes(12).tolist())) == 12
    bias = alibi_bias(4, 5)
    assert bias.shape == (4, 5, 5)
    assert bias[0, 4, 1].item() == pytest.approx(-0.25 * 3)
    assert torch.all(bias.diagonal(dim1=-2, dim2=-1) == 0)
    with pytest.raises(ValueError):
        alibi_slopes(0)
