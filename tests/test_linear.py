"""Linear attention: parallel = recurrent = chunked; GLA recurrent = chunked; FAVOR+ approaches softmax."""
import pytest
import torch
from hypothesis import given, strategies as st

from attnlab.attention import scaled_dot_product_attention
import math

from attnlab.linear import favor_feature, gated_linear_attention, linear_attention, orthogonal_gaussian


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


def _favor_estimates(q, k, m, seeds):
    """φ(q)·φ(k) for each seed's independent orthogonal features."""
    d = q.shape[-1]
    out = []
    for seed in seeds:
        omega = orthogonal_gaussian(m, d, seed=seed, dtype=torch.float64)
        out.append((favor_feature(q, omega) * favor_feature(k, omega)).sum(-1))
    return torch.stack(out)  # (seeds, pairs)


def test_favor_estimator_is_unbiased():
    """Mean over 2,000 independent draws within 4 standard errors of exp(q·k/√d), for each of
    six (q, k) pairs at d = 16 (the sign-uncorrected QR was 22 standard errors off)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(6, 16, generator=g, dtype=torch.float64) * 0.6
    k = torch.randn(6, 16, generator=g, dtype=torch.float64) * 0.6
    exact = torch.exp((q * k).sum(-1) / 4.0)
    draws = _favor_estimates(q, k, m=64, seeds=range(2000))
    standard_error = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((draws.mean(0) - exact).abs() < 4 * standard_error).all()


def test_orthogonal_features_have_no_preferred_sign():
    first = torch.stack([orthogonal_gaussian(16, 16, seed=s)[0, 0] for s in range(400)])
    assert 0.4 < (first > 0).double().mean().item() < 0.6


def test_favor_error_falls_like_one_over_root_m():
    """Root-mean-square error of the kernel estimate over 300 draws, at m = 16 … 1024:
    the log-log slope is at most -0.45 (Monte Carlo gives -1/2)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 16, generator=g, dtype=torch.float64) * 0.6
    k = torch.randn(4, 16, generator=g, dtype=torch.float64) * 0.6
    exact = torch.exp((q * k).sum(-1) / 4.0)
    ms = (16, 64, 256, 1024)
    rms = [((_favor_estimates(q, k, m, range(300)) - exact) ** 2).mean().sqrt().item() for m in ms]
    slope = torch.linalg.lstsq(torch.tensor([[math.log(m), 1.0] for m in ms]),
                               torch.tensor([[math.log(r)] for r in rms])).solution[0, 0].item()
    assert slope <= -0.45, (rms, slope)


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


@given(st.integers(1, 45), st.integers(1, 13), st.integers(1, 7), st.integers(0, 999))
def test_gla_matmul_chunk_form_equals_recurrent(n, chunk, sub_chunk, seed):
    """The hardware-efficient form (matrix products between sub-chunks, pairwise inside one)
    equals the recurrence at odd lengths, chunks and sub-chunks, including sub_chunk > chunk."""
    q, k, v = _qkv(n, seed=seed)
    log_decay = -torch.rand(2, 3, n, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    rec = gated_linear_attention(q, k, v, log_decay)
    fast = gated_linear_attention(q, k, v, log_decay, method="chunked_matmul", chunk=chunk, sub_chunk=sub_chunk)
    assert torch.allclose(rec, fast, atol=1e-10)


def test_gla_matmul_chunk_form_survives_strong_decay_in_float32():
    """log α = −6 per token over a 64-token chunk: b reaches −384, so e^{−b} overflows float32.
    The secondary chunks keep every factor ≤ 1, and the output stays finite and equal to the recurrence."""
    q, k, v = (t.float() for t in _qkv(64, seed=5))
    log_decay = torch.full_like(k, -6.0)
    b = log_decay.cumsum(-2)
    assert torch.isinf((-b).exp()).any()                       # the one-level form would overflow
    rec = gated_linear_attention(q, k, v, log_decay)
    fast = gated_linear_attention(q, k, v, log_decay, method="chunked_matmul", chunk=64, sub_chunk=8)
    assert torch.isfinite(fast).all()
    assert torch.allclose(rec, fast, atol=1e-5)


def test_gla_bad_method_and_sub_chunk():
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match="method must be one of"):
        gated_linear_attention(q, k, v, torch.zeros_like(k), method="fast")
    with pytest.raises(ValueError, match="sub_chunk must be a positive int"):
        gated_linear_attention(q, k, v, torch.zeros_like(k), method="chunked_matmul", sub_chunk=0)


def test_favor_stabilised_features_survive_large_norms_and_keep_the_output():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    q, k = 6 * q, 6 * k                          # ‖x̃‖²/2 ≈ 72 ± 25: whole rows reach 0 in float32
    omega = orthogonal_gaussian(32, 16, seed=3)
    raw = favor_feature(k, omega)
    assert (raw == 0).all(-1).any()              # whole rows underflow in the raw form
    for stabilise in ("row", "all"):
        f = favor_feature(k, omega, stabilise=stabilise)
        assert torch.isfinite(f).all() and f.max() <= 1 / 32 ** 0.5 + 1e-7
    assert (favor_feature(k, omega, stabilise="row").amax(-1) == 1 / 32 ** 0.5).all()
    # reference: raw features in float64 (no underflow there), the normalised output
    fq, fk = favor_feature(q.double(), omega.double()), favor_feature(k.double(), omega.double())
    exact = (fq @ (fk.transpose(-2, -1) @ v.double())) / (fq @ fk.sum(-2).unsqueeze(-1))
    fq32, fk32 = favor_feature(q, omega), favor_feature(k, omega)
    raw_out = (fq32 @ (fk32.transpose(-2, -1) @ v)) / (fq32 @ fk32.sum(-2).unsqueeze(-1))
    assert not torch.isfinite(raw_out).all()     # 0/0 where a query's features all underflow
    out = linear_attention(q, k, v, feature_map="favor", omega=omega)
    assert torch.isfinite(out).all() and (out.double() - exact).abs().max() < 1e-4
    # causal, at norms where the raw float32 features still work: all three forms agree
    q3, k3 = q / 2, k / 2
    fq, fk = favor_feature(q3.double(), omega.double()), favor_feature(k3.double(), omega.double())
    a = (fq @ fk.transpose(-2, -1)).tril()
    exact = (a @ v.double()) / a.sum(-1, keepdim=True)
    for method in ("parallel", "recurrent", "chunked"):
        out = linear_attention(q3, k3, v, feature_map="favor", omega=omega, causal=True, method=method, chunk=7)
        assert (out.double() - exact).abs().max() < 1e-4, method
    with pytest.raises(ValueError):
        favor_feature(q, omega, stabilise="max")
